"""Admission gate: new requests wait while the control plane finalizes a reconfiguration.

Requests already running are never held here; only new ones are. The wait is bounded in
queue length and in time, and each bound answers 503 with its name, so a client can tell
a full queue from a reconfiguration that took too long.

When the gate opens, the waiting requests go in the order of their priority (higher
first, SGLang's default direction), then of arrival: the router's own admission order,
so a predicted straggler's turn that waited is placed and sent before the others, also
to workers that have no priority scheduling of their own.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
from contextlib import asynccontextmanager
from typing import AsyncIterator

from pearl_sglang.router.errors import ServiceUnavailable


class AdmissionGate:
    def __init__(self, *, max_waiting: int = 10000, wait_timeout_s: float = 60.0) -> None:
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self._is_open = True
        self._holders = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # (-priority, arrival, future)
        self._arrivals = itertools.count()
        self.waiting = 0
        self.reason = ""

    @property
    def is_open(self) -> bool:
        return self._is_open

    @asynccontextmanager
    async def closed(self, reason: str) -> AsyncIterator[None]:
        """Hold new requests for the duration of the block (nesting allowed)."""
        self._holders += 1
        self.reason = reason
        self._is_open = False
        try:
            yield
        finally:
            self._holders -= 1
            if self._holders == 0:
                self.reason = ""
                self._is_open = True
                self._release()

    def _release(self) -> None:
        """Wake the waiters in (priority, arrival) order: their tasks resume in the order
        their futures complete, so the first released routes and sends first."""
        waiters = self._waiters
        while waiters:
            _, _, fut = heapq.heappop(waiters)
            if not fut.done():
                fut.set_result(None)

    async def admit(self, priority: int = 0) -> None:
        if self._is_open:
            return
        if self.waiting >= self.max_waiting:
            raise ServiceUnavailable(
                f"admission queue is full ({self.max_waiting} waiting) during: {self.reason}",
                kind="limit_admission_queue")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (-priority, next(self._arrivals), fut))
        self.waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.wait_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceUnavailable(
                f"admission paused longer than {self.wait_timeout_s:.0f}s during: {self.reason}",
                kind="admission_timeout") from None
        finally:
            self.waiting -= 1
            if not fut.done():
                fut.cancel()  # left behind in the heap; _release skips it
