"""Requests in flight through the router: which workers hold each rid, and why it ended.

The router knows every rid it sent, so it aborts with exact rids (SGLang 0.5.23 ignores an
abort whose rid is only a prefix of a batch's ``{rid}_{i}`` items) and tells a client's
abort (finish and return the partial output) from the control plane's drain (resubmit
the partial output elsewhere).  Each attempt runs on its workers under its own rid
(``worker_rid``): SGLang aborts a request that reuses the rid of a stream that ended less
than 2 s before, so a resubmission under the client's rid would be aborted again.

Ending requests and waiting for a worker to hold none are operations of the registry:
``end`` records why a request ends (a client's abort wins over a move), and ``emptied``
is a future done when the last request leaves a slot, so a drain awaits that event
rather than looking again and again.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable

from pearl_sglang.router.errors import BadRequest


class EndCause(str, Enum):
    CLIENT_ABORT = "client_abort"
    MIGRATE = "migrate"


@dataclass
class InFlight:
    rid: str
    slots: tuple[int, ...] = ()
    urls: tuple[str, ...] = ()
    cause: EndCause | None = None
    worker_rid: str = ""
    # False for OpenAI requests proxied as they are: the router holds no token ids to
    # resubmit, so a drain waits for them to finish instead of aborting them.
    movable: bool = True
    _aborted: asyncio.Future[None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.worker_rid = self.worker_rid or self.rid

    def end(self, cause: EndCause) -> None:
        if cause is EndCause.CLIENT_ABORT or self.cause is None:
            self.cause = cause
        if cause is EndCause.CLIENT_ABORT and self._aborted is not None and not self._aborted.done():
            self._aborted.set_result(None)

    def aborted(self) -> asyncio.Future[None]:
        """Done once a client's abort ends this request: what a wait before it reaches a
        worker (the admission gate, a route) races against, and a proxied request its
        worker knows by other rids (``passthrough.abortable``)."""
        if self._aborted is None:
            self._aborted = asyncio.get_running_loop().create_future()
            if self.cause is EndCause.CLIENT_ABORT:
                self._aborted.set_result(None)
        return self._aborted


@dataclass
class InFlightRegistry:
    _by_rid: dict[str, InFlight] = field(default_factory=dict)
    _per_slot: dict[int, int] = field(default_factory=dict)
    # Told (slot, before, after) on every change of a slot's count (utilization).
    on_count: Callable[[int, int, int], None] | None = None
    _emptied: dict[int, list[asyncio.Future[None]]] = field(default_factory=dict)

    def open(self, rid: str, *, movable: bool = True) -> InFlight:
        entry = InFlight(rid=rid, movable=movable)
        self._by_rid[rid] = entry
        return entry

    def assign(self, entry: InFlight, slots: tuple[int, ...], urls: tuple[str, ...],
               worker_rid: str | None = None) -> None:
        """Move ``entry`` to the workers of its current attempt (counts kept per slot),
        which know it as ``worker_rid``."""
        self._count(entry.slots, -1)
        entry.slots, entry.urls = slots, urls
        if worker_rid is not None:
            entry.worker_rid = worker_rid
        self._count(slots, +1)

    def close(self, rid: str) -> None:
        entry = self._by_rid.pop(rid, None)
        if entry is not None:
            self._count(entry.slots, -1)

    def _count(self, slots: tuple[int, ...], delta: int) -> None:
        for slot in slots:
            before = self._per_slot.get(slot, 0)
            n = before + delta
            if self.on_count is not None:
                self.on_count(slot, before, n)
            if n:
                self._per_slot[slot] = n
            else:
                self._per_slot.pop(slot, None)
                for waiter in self._emptied.pop(slot, ()):
                    if not waiter.done():
                        waiter.set_result(None)

    def end(self, entries: Iterable[InFlight], cause: EndCause) -> None:
        """Record why these requests end, for the dispatcher to read when their worker
        stops them: a client's abort (finish with the partial output) always, a move
        (resubmit it elsewhere) unless a client's abort came first."""
        for entry in entries:
            entry.end(cause)

    def emptied(self, slot: int) -> asyncio.Future[None]:
        """A future done once no request is on ``slot`` (at once if none is now)."""
        waiter = asyncio.get_running_loop().create_future()
        if self._per_slot.get(slot):
            self._emptied.setdefault(slot, []).append(waiter)
        else:
            waiter.set_result(None)
        return waiter

    def is_open(self, rid: str) -> bool:
        return rid in self._by_rid

    def refuse_open(self, rids: Iterable[str]) -> None:
        """A request naming a rid already in flight is a 400: the two would be one to an abort."""
        busy = [rid for rid in rids if rid in self._by_rid]
        if busy:
            raise BadRequest(f"rid {busy[0]!r} is already in flight", kind="duplicate_rid")

    def __len__(self) -> int:
        return len(self._by_rid)

    def load(self) -> dict[int, int]:
        """Requests in flight per worker slot (a prefill and its decode both count)."""
        return self._per_slot

    def matching(self, rid: str | None) -> list[InFlight]:
        """``rid`` matches itself and any rid it is a prefix of; ``None`` matches all."""
        if rid is None:
            return list(self._by_rid.values())
        return [e for e in self._by_rid.values() if e.rid == rid or e.rid.startswith(rid)]

    def on_slot(self, slot: int) -> list[InFlight]:
        if not self._per_slot.get(slot):
            return []
        return [e for e in self._by_rid.values() if slot in e.slots]
