"""Emulated time for the workload: one object says how to read time and how to wait.

The workload speaks emulated seconds (an environment step of 10 s, a training step of
160 s).  ``time_scale`` is emulated seconds per second of the underlying clock, the same
convention as the emulated worker's ``--time-scale``, so a demo at ``time_scale=50``
runs a 3-minute step in under 4 real seconds against workers started with the same
scale.  Under a virtual-time event loop (benchmarks) keep ``time_scale=1``: the loop's
own clock and ``asyncio.sleep`` already jump, and nothing here reads the wall clock.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from pearl_sglang.clock import Clock
from pearl_sglang.core.errors import InvalidConfig

Sleep = Callable[[float], Awaitable[None]]


class LoopClock:
    """The running event loop's clock: virtual under a virtual-time loop, monotonic otherwise."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()


@dataclass(frozen=True)
class EmulatedTime:
    sleep: Sleep = asyncio.sleep
    clock: Clock = field(default_factory=LoopClock)
    time_scale: float = 1.0

    def validate(self) -> None:
        if not self.time_scale > 0:
            raise InvalidConfig("time_scale must be positive", key="time_scale")

    def now(self) -> float:
        """Emulated seconds (only differences are meaningful)."""
        return self.clock.now() * self.time_scale

    async def wait(self, emulated_s: float) -> None:
        await self.sleep(max(0.0, emulated_s) / self.time_scale)
