"""Injected time.

Nothing in PEARL's logic reads the wall clock directly: it receives a ``Clock``.
The router and the control plane run on ``LoopClock``, the event loop's own clock, which
is virtual when a trace replay runs them on a virtual-time loop; ``WallClock`` serves code
outside any loop; tests use ``ManualClock``, which moves only when told to.

``now`` orders events and measures durations (monotonic; only differences mean anything);
``sleep`` waits on the same scale; ``epoch`` is for timestamps that answers carry (an
OpenAI ``created``, a worker's registration time) and is never used to decide anything.
"""
from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on the scale of ``now``."""

    def epoch(self) -> float:
        """Seconds since the Unix epoch, for timestamps in answers."""


class LoopClock:
    """The running event loop's clock: real in production, virtual in trace replays."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def epoch(self) -> float:
        return time.time()


class WallClock:
    """Monotonic wall time, for code that runs outside an event loop (a thread waiting for
    processes to start): ``block`` waits by blocking the thread."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def block(self, seconds: float) -> None:
        time.sleep(seconds)

    def epoch(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to (``sleep`` moves it, and yields once)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)

    def epoch(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time cannot move backwards")
        self._now += seconds

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError("time cannot move backwards")
        self._now = t
