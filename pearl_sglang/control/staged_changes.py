"""Colocated <-> PD changes in waves, so the cluster serves while workers relaunch.

A mixin of ``Orchestrator`` (it uses its lock, store, planning and decision log): every
plan is begun through ``_begin_wave``, which begins only the first wave of it
(``core/waves.py``: the relaunches that leave a serving path of the old topology up);
once that wave is admitted, its growth plans the rest with ``_next_wave`` from the
table as it is then. The router serves colocated workers beside PD pairs meanwhile.
When no serving path of the old topology can be kept (1P1D -> 2C), the fewest workers
relaunch first, and the decision log and the log say so.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pearl_sglang.core.events import BeginPlan
from pearl_sglang.core.planner import Plan, plan
from pearl_sglang.core.waves import Wave, first_wave

if TYPE_CHECKING:
    from pearl_sglang.control.orchestrator import Orchestrator

log = logging.getLogger("pearl.control")


class StagedChanges:
    async def _begin_wave(self: "Orchestrator", operation: str, p: Plan) -> Wave:
        """Begin the part of ``p`` that keeps a serving path of the old topology up while
        it runs (core/waves.py); the growth plans the rest once it is admitted."""
        wave = first_wave(self.store.table, p)
        if wave.staged or not wave.keeps_serving:
            self.decisions.append({"operation": operation, "wave": wave.to_dict()})
            if wave.keeps_serving:
                log.info("%s: relaunching %d worker(s) first, %d once they serve (the old topology serves "
                         "meanwhile)", operation, len(wave.plan.switch), len(wave.deferred))
            else:
                log.warning("%s: no serving path of the old topology can be kept during this change; "
                            "nothing serves until the first %d relaunched worker(s) are ready",
                            operation, len(wave.plan.switch))
        await self.store.apply([BeginPlan(wave.plan)])
        return wave

    async def _next_wave(self: "Orchestrator", done: Wave, operation: str) -> Wave:
        """The rest of a staged change, planned from the table as it is now (the same
        target: the change was decided once). An event that arrives meanwhile cancels
        the growth while it waits for the lock, and re-plans itself."""
        async with self._lock:
            available = self._available(borrow=self.borrowing)
            return await self._begin_wave(f"{operation}_wave",
                                          plan(self.store.table, done.plan.target, available=available))
