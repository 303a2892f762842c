"""Getting a cluster back to its target after a growth stopped short of it.

A mixin of ``Orchestrator`` (it uses its lock, store, executor and planning): a growth
that stopped (a worker that would not start, a failed weight sync, PD probes that kept
failing) is planned again after a back-off, as an ordinary event, until the table has its
target; and when nothing serves at all, the workers of a failed group that did start are
admitted instead of being thrown away with it.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pearl_sglang.control.executor import ActivationFailed
from pearl_sglang.control.weights import NoDiskCopy
from pearl_sglang.control.worker_ops import WorkerOpError
from pearl_sglang.core.state import Activity, Role

if TYPE_CHECKING:
    from pearl_sglang.control.orchestrator import Orchestrator

log = logging.getLogger("pearl.control")


class GrowthRecovery:
    def _schedule_replan(self: "Orchestrator", operation: str) -> None:
        """A growth that stopped short of its target is planned again after a back-off
        (the delays of ``recovery.growth_backoff_s``, then the last one for good), so the
        cluster climbs back without waiting for the next admin call. Each attempt is an
        ordinary event: it re-plans on the table as it is then, and does nothing when the
        table already has its target."""
        backoff = self.config.recovery.growth_backoff_s
        delay = backoff[min(self._replans, len(backoff) - 1)]
        self._replans += 1
        if self._replan is not None and not self._replan.done():
            self._replan.cancel()
        self._replan = asyncio.ensure_future(self._replan_after(delay, operation))

    async def _replan_after(self: "Orchestrator", delay: float, operation: str) -> None:
        await asyncio.sleep(delay)
        async with self._lock:
            if self._growth is not None and not self._growth.task.done():
                return  # an event re-planned meanwhile
            wave = await self._begin(f"{operation}_replan", borrow=self.borrowing and not self.training)
            if not wave.plan.add and not any(w.activity is Activity.SWITCHING and not w.held
                                     for w in self.store.table.rollout_workers()):
                self._replans = 0
                return
            log.info("%s: re-planning after %.0fs (attempt %d)", operation, delay, self._replans)
            self._start_growth(wave, operation)

    def _servable_alone(self: "Orchestrator", ready: list) -> bool:
        """Whether workers that did start form a topology by themselves (colocated ones,
        or at least one prefill and one decode)."""
        roles = {self.store.table.worker(e.slot).role for e in ready}
        return Role.COLOCATED in roles or {Role.PREFILL, Role.DECODE} <= roles

    async def _admit_what_started(self: "Orchestrator", adds: list, results: list, operation: str) -> None:
        """All-or-nothing admission exists to keep a serving cluster coherent; when
        nothing serves, the workers that started are admitted (their failed peers are
        stopped) rather than thrown away, and a re-plan brings up the rest."""
        failed = [a.slot for a, r in zip(adds, results) if isinstance(r, BaseException)]
        started = [r for r in results if not isinstance(r, BaseException)]
        log.warning("%s: %d worker(s) failed while nothing serves; admitting the %d that started",
                    operation, len(failed), len(started))
        await self.executor.cancel_group(failed)
        try:
            await self.executor.verify_pd(started)
            async with self._pushing:
                ready = await self._catch_up(started)
                await self.executor.admit(ready, operation)
        except (ActivationFailed, WorkerOpError, NoDiskCopy) as err:
            log.warning("%s: the workers that started cannot serve either (%s); cancelling them", operation, err)
            await self.executor.cancel_group([e.slot for e in started])

