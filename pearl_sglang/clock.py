"""Injected time.

Nothing in PEARL's logic reads the wall clock directly: it receives a ``Clock``.
Production uses ``WallClock``; tests and trace replays use ``ManualClock`` (or a
virtual-time event loop built on it) so hours of events replay in seconds.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""


class WallClock:
    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time cannot move backwards")
        self._now += seconds

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError("time cannot move backwards")
        self._now = t
