"""Worker health: a circuit breaker per slot, fed by failed calls and periodic probes.

Only ACTIVE workers are probed. A worker that has released its memory or is switching
role is not ACTIVE in the table, and one that stays ACTIVE while it loads new weights is
marked with ``planned_pause``, so a planned pause is never mistaken for a dead worker; an
ACTIVE worker that fails ``failures_to_open`` calls in a row is kept out of routing for
``cooldown_s``, then given one trial.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import aiohttp

from pearl_sglang.clock import Clock, LoopClock
from pearl_sglang.state_store import StateStore

log = logging.getLogger("pearl.router.health")


@dataclass
class CircuitBreakers:
    failures_to_open: int = 3
    cooldown_s: float = 30.0
    clock: Clock = field(default_factory=LoopClock)
    _failures: dict[int, int] = field(default_factory=dict)
    _open_until: dict[int, float] = field(default_factory=dict)
    _paused: dict[int, int] = field(default_factory=dict)

    @contextmanager
    def planned_pause(self, slots: Iterable[int]) -> Iterator[None]:
        """Probe failures of these workers do not count while the block runs."""
        slots = tuple(slots)
        for slot in slots:
            self._paused[slot] = self._paused.get(slot, 0) + 1
        try:
            yield
        finally:
            for slot in slots:
                self._paused[slot] -= 1
                if not self._paused[slot]:
                    del self._paused[slot]

    def paused(self, slot: int) -> bool:
        return slot in self._paused

    def failure(self, slot: int, now: float | None = None) -> None:
        now = self.clock.now() if now is None else now
        self._failures[slot] = self._failures.get(slot, 0) + 1
        if self._failures[slot] >= self.failures_to_open:
            if slot not in self._open_until or self._open_until[slot] <= now:
                log.warning("circuit open for worker slot %s", slot)
            self._open_until[slot] = now + self.cooldown_s

    def trip(self, slot: int, now: float | None = None) -> None:
        """Open the circuit at once: the worker hung under a request (a stall is not a
        blip that a retry may clear)."""
        now = self.clock.now() if now is None else now
        self._failures[slot] = max(self._failures.get(slot, 0), self.failures_to_open)
        if slot not in self._open_until or self._open_until[slot] <= now:
            log.warning("circuit open for worker slot %s (stalled)", slot)
        self._open_until[slot] = now + self.cooldown_s

    def success(self, slot: int) -> None:
        self._failures.pop(slot, None)
        self._open_until.pop(slot, None)

    def open_slots(self, now: float | None = None) -> set[int]:
        if not self._open_until:  # every request asks; almost always nothing is open
            return set()
        now = self.clock.now() if now is None else now
        return {slot for slot, until in self._open_until.items() if until > now}


async def probe_loop(session: aiohttp.ClientSession, store: StateStore, breakers: CircuitBreakers,
                     interval_s: float, timeout_s: float = 20.0, *, clock: Clock) -> None:
    """Probe every ACTIVE worker each ``interval_s``, all at once: one hung worker must not
    delay the verdict on the others."""
    while True:
        await clock.sleep(interval_s)
        workers = [w for w in store.table.active() if w.endpoint]
        await asyncio.gather(*(_probe(session, w, breakers, timeout_s) for w in workers))


async def _probe(session: aiohttp.ClientSession, worker, breakers: CircuitBreakers, timeout_s: float) -> None:
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.get(worker.endpoint + "/health", timeout=timeout) as resp:
            ok = resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
        ok = False
    if ok:
        breakers.success(worker.slot)
    elif not breakers.paused(worker.slot):
        breakers.failure(worker.slot)
