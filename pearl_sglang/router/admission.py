"""Admission gate: new requests wait while the control plane finalizes a reconfiguration.

Requests already running are never held here; only new ones are. The wait is bounded in
queue length and in time, and each bound answers 503 with its name, so a client can tell
a full queue from a reconfiguration that took too long.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

from pearl_sglang.router.errors import ServiceUnavailable


class AdmissionGate:
    def __init__(self, *, max_waiting: int = 10000, wait_timeout_s: float = 60.0) -> None:
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self._open = asyncio.Event()
        self._open.set()
        self._holders = 0
        self.waiting = 0
        self.reason = ""

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @asynccontextmanager
    async def closed(self, reason: str) -> AsyncIterator[None]:
        """Hold new requests for the duration of the block (nesting allowed)."""
        self._holders += 1
        self.reason = reason
        self._open.clear()
        try:
            yield
        finally:
            self._holders -= 1
            if self._holders == 0:
                self.reason = ""
                self._open.set()

    async def admit(self) -> None:
        if self._open.is_set():
            return
        if self.waiting >= self.max_waiting:
            raise ServiceUnavailable(
                f"admission queue is full ({self.max_waiting} waiting) during: {self.reason}",
                kind="limit_admission_queue")
        self.waiting += 1
        try:
            await asyncio.wait_for(self._open.wait(), self.wait_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceUnavailable(
                f"admission paused longer than {self.wait_timeout_s:.0f}s during: {self.reason}",
                kind="admission_timeout") from None
        finally:
            self.waiting -= 1
