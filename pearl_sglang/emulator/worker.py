"""What the emulator's HTTP handlers share: the ``Worker`` (one per app, under ``WORKER``)
and the ``ScaledClock`` that maps the event loop's time to emulated time. The server
builds them (``server.py``); the handlers (``http_*.py``) and the metrics read them.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import aiohttp
from aiohttp import web

from .codec import ModelMeta, TextCodec
from .config import EmulatorArgs
from .engine import Engine
from .profile import PerformanceModel


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock (``time.monotonic`` for asyncio's own loops, a
    virtual clock under a virtual-time loop); ``time.monotonic`` outside a loop."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        return time.monotonic


class ScaledClock:
    """Emulated seconds = seconds of the event loop's clock x scale (the loop that is
    running when the clock is made; real monotonic time unless it is a virtual loop)."""

    def __init__(self, scale: float, source: Optional[Callable[[], float]] = None) -> None:
        self.scale = scale
        self._source = source or loop_clock()
        self._t0 = self._source()

    def now(self) -> float:
        return (self._source() - self._t0) * self.scale

    def source_time(self, emulated: float) -> float:
        """The source clock's reading at emulated time ``emulated``."""
        return self._t0 + emulated / self.scale

    def real_delay(self, emulated_s: float) -> float:
        return max(0.0, emulated_s / self.scale)


@dataclass
class Worker:
    """Everything the handlers share (one per app)."""

    args: EmulatorArgs
    profile: PerformanceModel
    engine: Engine
    codec: TextCodec
    meta: ModelMeta
    clock: ScaledClock
    started_wall: float
    session: Optional[aiohttp.ClientSession] = None
    weight_group: Optional[str] = None
    in_weight_update: bool = False
    closed: bool = False
    direct_runs: set = field(default_factory=set)  # runs of in-process callers (``direct``)
    # rid -> loop time at which the abort that follows the end of its stream fires
    stream_end_aborts: dict = field(default_factory=dict)

    def close(self) -> None:
        """The server is stopping: in-process callers lose their streams, as HTTP clients
        lose their connections."""
        self.closed = True
        for run in list(self.direct_runs):
            run.close()

    @property
    def served_model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path


WORKER = web.AppKey("worker", Worker)
