"""Growing the cluster to a plan's target, and getting back to it after a growth stopped short.

A mixin of ``Orchestrator`` (it uses its lock, store, executor and planning). A growth is
the switches and additions of one wave, run in the background and admitted together or
not at all (``_grow``); a PD group whose probe failed is re-planned after each back-off
(``_grow_with_retries``); one growth runs at a time, and an event that needs the GPUs
cancels it (``_cancel_growth``). A growth that stopped (a worker that would not start, a failed weight sync, PD probes that kept
failing) is planned again after a back-off, as an ordinary event, until the table has its
target; and when nothing serves at all, the workers of a failed group that did start are
admitted instead of being thrown away with it.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pearl_sglang.aio import gather_settled
from pearl_sglang.control.executor import ActivationFailed, GroupCancelled, PdProbeFailed
from pearl_sglang.control.expansions import Expansion, Growth, left_unknown
from pearl_sglang.control.launchers import LaunchError
from pearl_sglang.control.weights import NoDiskCopy
from pearl_sglang.core.errors import CoreError
from pearl_sglang.core.state import Activity, Role
from pearl_sglang.core.waves import Wave
from pearl_sglang.workers.errors import WorkerError

if TYPE_CHECKING:
    from pearl_sglang.control.orchestrator import Orchestrator

log = logging.getLogger("pearl.control")


class Growing:
    async def _grow(self: "Orchestrator", wave: Wave, operation: str) -> list[int]:
        """Switches and additions of ``wave``; admitted together, or the additions cancelled."""
        self._intent = {"operation": operation, "plan": wave.plan.to_dict()}
        self._persist()
        try:
            return await self._grow_now(wave, operation)
        finally:
            self._intent = None
            self._persist()

    async def _grow_now(self: "Orchestrator", wave: Wave, operation: str) -> list[int]:
        table, p = self.store.table, wave.plan
        # A deferred worker held because the wave took its partner stays held until its own wave.
        later = {c.slot for c in wave.deferred}
        switching = [w.slot for w in table.rollout_workers()
                     if w.activity is Activity.SWITCHING and w.slot not in later]
        adds = [a for a in p.add if table.has(a.slot) and table.worker(a.slot).activity is Activity.JOINING]
        jobs = [self.executor.switch(s, operation) for s in switching]
        jobs += [self.executor.activate(a, operation) for a in adds]
        results = await gather_settled(*jobs)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for r in failed:
                if isinstance(r, asyncio.CancelledError):
                    raise r
            reached = [r for r in results if not isinstance(r, BaseException)]
            if not switching and not self.store.table.active() and self._servable_alone(reached):
                await self._admit_what_started(adds, results, operation)
                raise GroupCancelled(f"{len(failed)} of {len(adds)} worker(s) could not be made ready "
                                     f"({failed[0]}); the {len(reached)} that started were admitted")
            log.warning("%s: %d worker(s) failed (%s); cancelling the group", operation, len(failed), failed[0])
            await self.executor.cancel_group([a.slot for a in adds] + switching, reached=reached)
            raise GroupCancelled(f"{len(failed)} worker(s) could not be made ready: {failed[0]}")
        try:
            await self.executor.verify_pd(list(results))
        except ActivationFailed as e:
            log.warning("%s: %s; cancelling the group", operation, e)
            await self.executor.cancel_group([a.slot for a in adds] + switching, reached=list(results))
            raise
        async with self._pushing:
            try:
                ready = await self._catch_up(list(results))
            except (WorkerError, NoDiskCopy) as e:
                log.warning("%s: could not load the latest weights before admission (%s); cancelling the group",
                            operation, e)
                await self.executor.cancel_group([a.slot for a in adds] + switching, reached=list(results))
                raise GroupCancelled(f"could not load the latest weights before admission: {e}") from e
            await self.executor.admit(ready, operation)
        return [a.slot for a in adds]

    async def _grow_with_retries(self: "Orchestrator", wave: Wave, operation: str) -> Growth:
        """``_grow`` wave after wave until the target is reached; after a failed PD probe
        (group cancelled), wait each back-off delay and re-plan, which relaunches the
        cancelled workers and pairs them anew."""
        backoff = self.config.recovery.pd_probe_backoff_s
        admitted: list[int] = []
        waves: list[dict[str, Any]] = []
        attempt = 0
        while True:
            try:
                admitted += await self._grow(wave, operation)
                if wave.staged or waves or not wave.keeps_serving:
                    waves.append(wave.to_dict())
                if not wave.staged:
                    self._replans = 0
                    return Growth(tuple(admitted), waves=tuple(waves))
                wave = await self._next_wave(wave, operation)
            except PdProbeFailed as e:
                reason = str(e)
                if attempt == len(backoff):
                    log.warning("%s: %s; re-planning with back-off", operation, e)
                    break
                await asyncio.sleep(backoff[attempt])
                attempt += 1
                async with self._lock:
                    wave = await self._begin(f"{operation}_pd_retry", borrow=self.borrowing)
            except (CoreError, ActivationFailed, LaunchError, WorkerError) as e:
                reason = str(e)
                log.warning("%s growth stopped: %s", operation, e)
                break
            except Exception as e:  # noqa: BLE001 - whatever stopped it, the cluster must climb back
                reason = f"{type(e).__name__}: {e}"
                log.exception("%s growth stopped by an unexpected error", operation)
                break
        self._schedule_replan(operation)
        return Growth(tuple(admitted), reason=reason, waves=tuple(waves))

    def _start_growth(self: "Orchestrator", wave: Wave, operation: str) -> Expansion:
        self._expansions += 1
        self._growth = Expansion(self._expansions, operation,
                                 asyncio.ensure_future(self._grow_with_retries(wave, operation)))
        return self._growth

    async def _regrow(self: "Orchestrator", event: str, operation: str, *, borrow: bool) -> Expansion:
        """Replace the growth in flight by one planned for ``event`` (one growth at a
        time); the caller holds ``_lock``."""
        await self._cancel_growth(by=event)
        wave = await self._begin(event, borrow=borrow)
        return self._start_growth(wave, operation)

    async def _cancel_growth(self: "Orchestrator", *, by: str) -> None:
        """Cancel the growth in flight on behalf of event ``by``. Callers hold ``_lock``
        and begin their own growth before letting go of it, which ``follow`` relies on."""
        growth, self._growth = self._growth, None
        if growth is None or growth.task.done():
            return
        growth.superseded_by = by
        growth.task.cancel()
        await asyncio.gather(growth.task, return_exceptions=True)
        stuck = left_unknown(self.store.table)
        if stuck:
            await self.executor.cancel_group(stuck)
        await self.executor.drop_dead_switches()

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
        except (ActivationFailed, WorkerError, NoDiskCopy) as err:
            log.warning("%s: the workers that started cannot serve either (%s); cancelling them", operation, err)
            await self.executor.cancel_group([e.slot for e in started])

