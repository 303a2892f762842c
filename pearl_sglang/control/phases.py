"""Reconfiguration telemetry: every operation's phases, timed on the event loop's clock."""
from __future__ import annotations

import asyncio
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable


@dataclass(frozen=True)
class PhaseRecord:
    operation: str
    phase: str
    seconds: float
    ok: bool
    zone: str | None = None  # a worker's phase: the zone of its GPUs ("dedicated", "overlap")


class PhaseLog:
    """Keeps the last records for ``/pearl/state`` and feeds a metrics callback."""

    def __init__(self, on_record: Callable[[PhaseRecord], None] = lambda r: None, keep: int = 500) -> None:
        self.records: deque[PhaseRecord] = deque(maxlen=keep)
        self.on_record = on_record

    @asynccontextmanager
    async def phase(self, operation: str, phase: str, zone: str | None = None) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        start, ok = loop.time(), False
        try:
            yield
            ok = True
        finally:
            record = PhaseRecord(operation, phase, loop.time() - start, ok, zone)
            self.records.append(record)
            self.on_record(record)

    def mean_s(self, phase: str, zone: str | None = None) -> float | None:
        """Mean seconds of the successful ``phase`` records of any operation, of workers in
        ``zone`` when given; None when there are none."""
        seconds = [r.seconds for r in self.records if r.ok and r.phase == phase and zone in (None, r.zone)]
        return sum(seconds) / len(seconds) if seconds else None

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean seconds and count per ``operation/phase`` (successful ones)."""
        acc: dict[str, list[float]] = {}
        for r in self.records:
            if r.ok:
                acc.setdefault(f"{r.operation}/{r.phase}", []).append(r.seconds)
        return {k: {"mean_s": sum(v) / len(v), "count": len(v)} for k, v in sorted(acc.items())}
