"""Growing the cluster to a plan's target, and getting back to it after a growth stopped short.

A growth is the switches and additions of one wave, run in the background and admitted
together or not at all (``_grow``); a PD group whose probe failed is re-planned after each
back-off (``grow_with_retries``); one growth runs at a time, and an event that needs the
GPUs cancels it (``cancel``). A growth that stopped (a worker that would not start, a
failed weight sync, PD probes that kept failing) is planned again after a back-off, as an
ordinary event, until the table has its target; and when nothing serves at all, the
workers of a failed group that did start are admitted instead of being thrown away with
it. Plans come from the control shell (``Planning``): every decision is the core's.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from pearl_sglang.aio import gather_settled, raise_if_cancelling
from pearl_sglang.control.cluster_config import RecoveryConfig
from pearl_sglang.control.executor import ActivationFailed, GroupCancelled, PdProbeFailed, PlanExecutor
from pearl_sglang.control.expansions import Expansion, Growth, left_unknown
from pearl_sglang.control.launchers import LaunchError
from pearl_sglang.control.weight_pushes import WeightLoading
from pearl_sglang.control.weights import NoDiskCopy
from pearl_sglang.core.control import ControlState, Effects, Event, GrowthBegun, GrowthEnded
from pearl_sglang.core.errors import CoreError
from pearl_sglang.core.state import Activity, Role
from pearl_sglang.core.waves import Wave
from pearl_sglang.workers.errors import WorkerError

log = logging.getLogger("pearl.control")


class Planning(Protocol):
    """What a growth needs from the control shell: its lock, the core's state and events,
    and the next wave of a plan (begun on the table)."""

    lock: asyncio.Lock
    state: ControlState

    def on(self, event: Event) -> Effects: ...

    async def begin(self, operation: str, *, borrow: bool) -> Wave:
        """Decide and begin the first wave of a plan; the caller holds ``lock``."""

    async def next_wave(self, done: Wave, operation: str) -> Wave:
        """Begin the next wave of a staged change (takes ``lock``)."""


class Growths:
    def __init__(self, *, shell: Planning, executor: PlanExecutor, weights: WeightLoading,
                 recovery: RecoveryConfig) -> None:
        self.shell, self.executor, self.store = shell, executor, executor.store
        self.weights, self.recovery = weights, recovery
        self.current: Expansion | None = None
        self._expansions = 0
        self._replan: asyncio.Task | None = None
        self._replans = 0  # growths in a row that stopped short: indexes the back-off

    async def _grow(self, wave: Wave, operation: str) -> list[int]:
        """Switches and additions of ``wave``; admitted together, or the additions cancelled."""
        self.shell.on(GrowthBegun(operation, wave.plan))
        try:
            return await self._grow_now(wave, operation)
        finally:
            self.shell.on(GrowthEnded())

    async def _grow_now(self, wave: Wave, operation: str) -> list[int]:
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
        async with self.weights.lock:
            try:
                ready = await self.weights.catch_up(list(results), self.shell.state.snapshot)
            except (WorkerError, NoDiskCopy) as e:
                log.warning("%s: could not load the latest weights before admission (%s); cancelling the group",
                            operation, e)
                await self.executor.cancel_group([a.slot for a in adds] + switching, reached=list(results))
                raise GroupCancelled(f"could not load the latest weights before admission: {e}") from e
            await self.executor.admit(ready, operation)
        return [a.slot for a in adds]

    async def grow_with_retries(self, wave: Wave, operation: str) -> Growth:
        """``_grow`` wave after wave until the target is reached; after a failed PD probe
        (group cancelled), wait each back-off delay and re-plan, which relaunches the
        cancelled workers and pairs them anew."""
        backoff = self.recovery.pd_probe_backoff_s
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
                raise_if_cancelling()  # an event cancelling this growth holds the lock (``cancel``)
                wave = await self.shell.next_wave(wave, operation)
            except PdProbeFailed as e:
                reason = str(e)
                if attempt == len(backoff):
                    log.warning("%s: %s; re-planning with back-off", operation, e)
                    break
                await asyncio.sleep(backoff[attempt])
                attempt += 1
                raise_if_cancelling()
                async with self.shell.lock:
                    wave = await self.shell.begin(f"{operation}_pd_retry", borrow=self.shell.state.borrowing)
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

    def start(self, wave: Wave, operation: str) -> Expansion:
        self._expansions += 1
        self.current = Expansion(self._expansions, operation,
                                 asyncio.ensure_future(self.grow_with_retries(wave, operation)))
        return self.current

    async def regrow(self, event: str, operation: str, *, borrow: bool) -> Expansion:
        """Replace the growth in flight by one planned for ``event`` (one growth at a
        time); the caller holds the shell's lock."""
        await self.cancel(by=event)
        wave = await self.shell.begin(event, borrow=borrow)
        return self.start(wave, operation)

    async def cancel(self, *, by: str) -> None:
        """Cancel the growth in flight on behalf of event ``by``. Callers hold the shell's
        lock and begin their own growth before letting go of it, which ``follow`` relies on."""
        growth, self.current = self.current, None
        if growth is None or growth.task.done():
            return
        growth.superseded_by = by
        growth.task.cancel()
        await asyncio.gather(growth.task, return_exceptions=True)
        stuck = left_unknown(self.store.table)
        if stuck:
            await self.executor.cancel_group(stuck)
        await self.executor.drop_dead_switches()

    async def close(self) -> None:
        """Shutdown: no re-plan, and the growth in flight cancelled."""
        if self._replan is not None:
            self._replan.cancel()
            await asyncio.gather(self._replan, return_exceptions=True)
        await self.cancel(by="shutdown")

    def _schedule_replan(self, operation: str) -> None:
        """A growth that stopped short of its target is planned again after a back-off
        (the delays of ``recovery.growth_backoff_s``, then the last one for good), so the
        cluster climbs back without waiting for the next admin call. Each attempt is an
        ordinary event: it re-plans on the table as it is then, and does nothing when the
        table already has its target."""
        backoff = self.recovery.growth_backoff_s
        delay = backoff[min(self._replans, len(backoff) - 1)]
        self._replans += 1
        if self._replan is not None and not self._replan.done():
            self._replan.cancel()
        self._replan = asyncio.ensure_future(self._replan_after(delay, operation))

    async def _replan_after(self, delay: float, operation: str) -> None:
        await asyncio.sleep(delay)
        async with self.shell.lock:
            if self.current is not None and not self.current.task.done():
                return  # an event re-planned meanwhile
            state = self.shell.state
            wave = await self.shell.begin(f"{operation}_replan", borrow=state.borrowing and not state.training)
            # A held worker (it lost its partner in a cancelled group) waits for a wave to
            # admit it with a new one: only this re-plan will start that wave.
            if not wave.plan.add and not any(w.activity is Activity.SWITCHING
                                             for w in self.store.table.rollout_workers()):
                self._replans = 0
                return
            log.info("%s: re-planning after %.0fs (attempt %d)", operation, delay, self._replans)
            self.start(wave, operation)

    def _servable_alone(self, ready: list) -> bool:
        """Whether workers that did start form a topology by themselves (colocated ones,
        or at least one prefill and one decode)."""
        roles = {self.store.table.worker(e.slot).role for e in ready}
        return Role.COLOCATED in roles or {Role.PREFILL, Role.DECODE} <= roles

    async def _admit_what_started(self, adds: list, results: list, operation: str) -> None:
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
            async with self.weights.lock:
                ready = await self.weights.catch_up(started, self.shell.state.snapshot)
                await self.executor.admit(ready, operation)
        except (ActivationFailed, WorkerError, NoDiskCopy) as err:
            log.warning("%s: the workers that started cannot serve either (%s); cancelling them", operation, err)
            await self.executor.cancel_group([e.slot for e in started])

