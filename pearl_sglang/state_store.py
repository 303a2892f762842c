"""The live holder of the GPU-worker-role table.

The table itself is an immutable snapshot (``core.state``); this store is the one place
that swaps snapshots. Updates are serialized by a lock so concurrent events never act on
stale state; readers (the router, metrics) take ``store.table`` each time they need it
and never keep a copy. Waiters are woken on every change.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from pearl_sglang.core.events import Event, apply_all
from pearl_sglang.core.state import StateTable


class StateStore:
    def __init__(self, table: StateTable) -> None:
        self._table = table
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[StateTable, StateTable], None]] = []

    @property
    def table(self) -> StateTable:
        return self._table

    @property
    def lock(self) -> asyncio.Lock:
        """Held by whoever reads, decides and updates as one step (the orchestrator)."""
        return self._lock

    def on_change(self, listener: Callable[[StateTable, StateTable], None]) -> None:
        self._listeners.append(listener)

    async def apply(self, events: Iterable[Event]) -> StateTable:
        async with self._lock:
            return self.apply_locked(events)

    def apply_locked(self, events: Iterable[Event]) -> StateTable:
        """Apply while the caller already holds ``lock``."""
        old, new = self._table, apply_all(self._table, events)
        self._table = new
        for listener in self._listeners:
            listener(old, new)
        self._changed.set()
        self._changed = asyncio.Event()
        return new

    def replace_locked(self, table: StateTable) -> None:
        """Install a reconciled snapshot (restart, attach); caller holds ``lock``."""
        old, self._table = self._table, table
        for listener in self._listeners:
            listener(old, table)
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> bool:
        """Wait for the next update; False on timeout."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
