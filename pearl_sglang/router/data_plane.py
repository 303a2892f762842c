"""The router as the control plane's data plane (``control.data_plane.DataPlane``).

Each operation is the router's own: draining is the dispatcher's migration with partial
output kept (``drain``), admission pauses close the admission gate, planned pauses and
replaced processes go to the circuit breakers, and step records come from telemetry and
utilization. The port is structural, so this module needs nothing from the control plane.
"""
from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from typing import Iterable

from pearl_sglang.core.telemetry import StepTelemetry
from pearl_sglang.router.drain import drain
from pearl_sglang.router.state import RouterState


class RouterDataPlane:
    def __init__(self, st: RouterState) -> None:
        self._st = st

    async def drain(self, slot: int, deadline_s: float) -> bool:
        return await drain(self._st, slot, deadline_s)

    def admission_paused(self, reason: str) -> AbstractAsyncContextManager[None]:
        return self._st.gate.closed(reason)

    def planned_pause(self, slots: Iterable[int]) -> AbstractContextManager[None]:
        return self._st.breakers.planned_pause(slots)

    def process_replaced(self, slot: int) -> None:
        self._st.breakers.success(slot)

    def close_step(self) -> StepTelemetry:
        usage = self._st.utilization.close_step()
        started = usage["started"]
        return replace(self._st.telemetry.drain(),
                       worker_busy_s=tuple((int(slot), w["busy_s"]) for slot, w in usage["workers"].items()),
                       span_s=0.0 if started is None else usage["ended"] - started)

    def turns_done(self, now: float) -> list[int]:
        return [t.turns_done for t in self._st.telemetry.progress(now)]
