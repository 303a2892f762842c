"""The elastic control plane: every event goes budget -> decision -> plan -> executor.

Events (train_begin, train_finished, GPUs join, GPUs leave) are serialized by one lock:
each updates the table, asks the decision engine for a target under the new budget,
turns it into a minimal-change plan and begins it (``BeginPlan``), all on the current
snapshot, so concurrent events never act on stale state. Execution is asynchronous.
Mandatory work (returning training GPUs, giving back reclaimed GPUs) is awaited before
the event answers and first cancels optional growth in flight (borrowing, expansion);
optional growth runs in the background and admits its workers all at once or not at all.
A colocated <-> PD change is begun in waves that keep the old topology serving while the
first new workers start (staged_changes.py); each wave is such an all-or-nothing growth
(growth.py).
Callers that wait for a growth follow it to the growth that superseded it (expansions.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import replace
from typing import Any, Callable

from pearl_sglang.aio import gather_settled
from pearl_sglang.control import policy
from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.control.executor import PlanExecutor
from pearl_sglang.control.expansions import Expansion, follow, join_answer, readied_on
from pearl_sglang.control.growth import Growing
from pearl_sglang.control.idempotency import OnceByRequestId
from pearl_sglang.control.persistence import ControlRecord, StateFile
from pearl_sglang.control.phases import PhaseLog
from pearl_sglang.control.reconcile import reconcile
from pearl_sglang.control.staged_changes import StagedChanges
from pearl_sglang.control.weight_group import WeightGroups
from pearl_sglang.control.weight_pushes import WeightPushes
from pearl_sglang.control.weights import WeightSnapshot
from pearl_sglang.core.decision import Decision
from pearl_sglang.core.events import (
    GpusJoin, GpusLeave, TrainBegin, TrainFinished, WorkerLost,
)
from pearl_sglang.core.gate import ToggleCostEstimator
from pearl_sglang.core.learning_gate import Exploration, LearningGate
from pearl_sglang.core.mode_feedback import ModeCorrection
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.planner import plan
from pearl_sglang.core.pool_usage import pool_usage
from pearl_sglang.core.registered import locked_pd_mode, relaunch_lock
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.step_learning import StepLearning
from pearl_sglang.core.step_model import MakespanModel, StepContext
from pearl_sglang.core.state import Activity, OverlapOwner, StateTable, Zone
from pearl_sglang.core.telemetry import ProfileFit, ProfileTracker, fitted_symbols
from pearl_sglang.core.topology import Mode, Topology
from pearl_sglang.core.waves import Wave

log = logging.getLogger("pearl.control")


class OutOfOrder(RuntimeError):
    """A call that contradicts the training state (two train_begin, finished without begin)."""


class Orchestrator(WeightPushes, Growing, StagedChanges):
    def __init__(self, *, config: ClusterConfig, executor: PlanExecutor, state_file: StateFile | None = None,
                 on_decision: Callable[[dict[str, Any]], None] = lambda d: None) -> None:
        self.config = config
        self.executor = executor
        self.store = executor.store
        self.phases: PhaseLog = executor.phases
        self.on_decision = on_decision
        # The profile fit, the gate's toggle cost, the per-mode correction and the record of
        # predicted vs observed steps, learned at each train_begin (core.step_learning).
        self.learning = StepLearning(
            model=MakespanModel.parse(config.makespan_model), tracker=ProfileTracker(alpha=config.gate.alpha),
            gate=LearningGate(
                ToggleCostEstimator(initial_s=config.gate.toggle_cost_s, alpha=config.gate.alpha),
                Exploration(rate=config.gate.exploration_rate,
                            max_benefit_ratio=config.gate.explore_max_benefit_ratio)),
            modes=ModeCorrection(config.mode_feedback), time_scale=config.time_scale)
        # Until the trainer pushes, the launch checkpoint is the snapshot to (re)load from.
        self.snapshot = WeightSnapshot(version=config.engine.weight_version,
                                       model_path=config.engine.model_path or None)
        # Adopted pushes, numbered: the router keeps workers too far behind out of routing.
        self.pushes = PushLog.start(self.snapshot.version, max_staleness=config.weights.max_staleness)
        self.groups = WeightGroups(executor.ops, init_timeout_s=config.weights.group_init_timeout_s)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=50)
        self.borrowing = False
        self._borrowed_since: float | None = None  # shell-clock time of the last borrow
        self._overruled = False  # the pool-usage check kept the step in progress unborrowed
        self.training = False
        self._lock = asyncio.Lock()
        self._growth: Expansion | None = None
        self._expansions = 0
        self._pushing = asyncio.Lock()  # weight pushes and admissions (weight_pushes.py)
        self._replan: asyncio.Task | None = None
        self._replans = 0  # growths in a row that stopped short: indexes the back-off
        self._once = OnceByRequestId().run
        self.last_step: dict[str, int | None] = {"begin": None, "finished": None}
        self.state_file = state_file
        self._intent: dict[str, Any] | None = None
        self.recovery: dict[str, Any] | None = None
        self.store.on_change(lambda old, new: self._persist())
        watch = getattr(executor.launcher, "watch", None)
        if watch is not None:
            watch(self._persist)

    # -- crash safety --------------------------------------------------------------------
    def _persist(self) -> None:
        if self.state_file is None:
            return
        launcher = self.executor.launcher
        pid = getattr(launcher, "pid", lambda slot: None)
        workers = {str(w.slot): {"endpoint": w.endpoint, "pid": pid(w.slot)}
                   for w in self.store.table.rollout_workers()}
        for slot in getattr(launcher, "slots", tuple)():  # started, not yet in the table's view
            workers.setdefault(str(slot), {"endpoint": None, "pid": pid(slot)})
        self.state_file.save(ControlRecord(
            table=self.store.table.to_dict(), snapshot=self.snapshot.to_dict(), training=self.training,
            borrowing=self.borrowing, last_step=dict(self.last_step), workers=workers, intent=self._intent,
            pushes=self.pushes.to_dict()))

    async def _recover(self, record: ControlRecord) -> None:
        """Restart path: reconcile the recorded table with reality, then finish or roll
        back what was in flight and continue from the reconciled state."""
        result = await reconcile(StateTable.from_dict(record.table), record.workers, self.executor.ops)
        adopt = getattr(self.executor.launcher, "adopt", None)
        for slot, pid in result.adopted.items():
            if adopt is not None:
                adopt(slot, pid)
        self.snapshot = WeightSnapshot.from_dict(record.snapshot)
        reported = tuple(sorted({w.weight_version for w in result.table.active() if w.weight_version}))
        max_staleness = self.config.weights.max_staleness
        self.pushes = (PushLog.from_dict(record.pushes, max_staleness=max_staleness, also=reported)
                       if record.pushes else
                       PushLog.start(self.snapshot.version, max_staleness=max_staleness, also=reported))
        self.training, self.borrowing = record.training, record.borrowing
        self.last_step = dict(record.last_step)
        self.recovery = {"intent": record.intent, "notes": result.notes}
        async with self._lock:
            async with self.store.lock:
                self.store.replace_locked(result.table)
            await self._deactivate_leaving("recovery", self.config.deadlines.train_begin_s)
            wave = await self._begin("recovery", borrow=self.borrowing and not self.training)
        await self._grow_with_retries(wave, "recovery")

    # -- inputs of decisions -------------------------------------------------------------
    @property
    def tracker(self) -> ProfileTracker:
        """The profile fit (a new object with each fit: the router reprices placement on it)."""
        return self.learning.tracker

    def profile(self) -> Profile:
        """The configured profile with the symbols telemetry has identified replaced (all,
        or the workload's alone: ``profile_fit``)."""
        return replace(self.config.profile, **fitted_symbols(self.learning.tracker.estimate,
                                                             ProfileFit(self.config.profile_fit)))

    def _available(self, *, borrow: bool) -> frozenset[str]:
        table = self.store.table
        if borrow and table.overlap_owner is OverlapOwner.ROLLOUT:
            return table.available_gpus()
        return frozenset(table.dedicated_gpus)

    def _context(self, *, fresh: bool) -> StepContext:
        """Where the rollout step stands: at its start a fresh batch; mid-step the turns
        each trajectory has done (the data plane's telemetry) and the time it has run."""
        if fresh or self.learning.started_at is None:
            return self.learning.context()
        now = asyncio.get_running_loop().time()
        return self.learning.context(now=now, turns_done=tuple(self.executor.data_plane.turns_done(now)),
                                     profile=self.profile())

    def _decide(self, operation: str, budget: int) -> Decision | None:
        if budget == 0:
            return None
        lock = relaunch_lock(self.store.table)
        config = replace(self.config, pd_mode=locked_pd_mode(self.config.pd_mode, lock))
        # A step's rollout starts with train_begin (staleness one: the next batch starts as
        # training does); other events decide on the work left of the step in progress.
        ctx = self._context(fresh=operation in ("bootstrap", "recovery", "train_begin"))
        profile = self.profile()
        modes = self.learning.modes
        decision = policy.target_topology(config, self.store.table, profile, budget, ctx, modes)
        record = {"operation": operation, "budget": budget, "makespan_model": config.makespan_model,
                  "mode_factors": {m.value: modes.factor(m) for m in Mode}, **decision.to_dict()}
        if lock is not None:
            record["mode_lock"] = lock.to_dict()
        self.decisions.append(record)
        self.learning = self.learning.predicted(profile, decision.choice, ctx)
        self.on_decision(record)
        return decision

    async def _begin(self, operation: str, *, borrow: bool) -> Wave:
        """Decide and begin the first wave of a plan on the current snapshot; the caller
        holds ``_lock``."""
        available = self._available(borrow=borrow)
        budget = self.store.table.budget(available)
        decision = self._decide(operation, budget)
        target = decision.choice if decision else Topology(0, 0, 0)
        return await self._begin_wave(operation, plan(self.store.table, target, available=available))

    # -- execution -------------------------------------------------------------------------
    async def _deactivate_leaving(self, operation: str, deadline_s: float) -> list[int]:
        """Deactivate every LEAVING worker. The deadline wins over draining: whatever is
        still leaving when it comes is stopped at once (its requests move elsewhere with
        their partial output), so the GPUs are free when this returns."""
        leaving = [w.slot for w in self.store.table.rollout_workers() if w.activity is Activity.LEAVING]
        if not leaving:
            return []
        jobs = [asyncio.ensure_future(self.executor.deactivate(s, operation)) for s in leaving]
        done, pending = await asyncio.wait(jobs, timeout=deadline_s)
        for job in pending:
            job.cancel()
        await gather_settled(*pending)
        events = [job.result() for job in done if not job.cancelled() and job.exception() is None]
        forced = [s for s, job in zip(leaving, jobs) if job in pending or job.cancelled() or job.exception()]
        for slot in forced:
            log.warning("%s: slot %s not deactivated by its deadline; stopping it", operation, slot)
            await self.executor.kill(slot)
        events += [WorkerLost(s) for s in forced if self.store.table.has(s)]
        await self.store.apply(events)
        return leaving

    # -- events ------------------------------------------------------------------------------
    async def start(self) -> list[int]:
        record = self.state_file.load() if self.state_file is not None else None
        if record is not None:
            await self._recover(record)
            return [w.slot for w in self.store.table.active()]
        async with self._lock:
            wave = await self._begin("bootstrap", borrow=False)
        return list((await self._grow_with_retries(wave, "bootstrap")).admitted)

    async def train_begin(self, *, step: int, request_id: str | None = None) -> dict[str, Any]:
        return await self._once("train_begin", request_id, {"step": step}, lambda: self._train_begin(step))

    async def _train_begin(self, step: int) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self._lock:
            if self.training and self.last_step["begin"] == step and self.store.table.training_owns_overlap:
                return {"step": step, "returned_gpus": sorted(self.store.table.overlap_gpus), "elapsed_s": 0.0,
                        "repeated_step": True}
            if self.training:
                raise OutOfOrder(f"train_begin for step {step} while step {self.last_step['begin']} "
                                 "is still training (call train_finished first)")
            self.training = True
            self.last_step["begin"] = step
            self._persist()
            # The batch is complete: close the step (its time, telemetry and the prediction
            # made for it) before deciding the next rollout's topology, which starts now.
            self._observe_step(started)
            await self._cancel_growth(by="train_begin")
            returned = sorted(self.store.table.overlap_gpus)
            if self.store.table.overlap_owner is OverlapOwner.ROLLOUT:
                await self.store.apply([TrainBegin()])
            wave = await self._begin("train_begin", borrow=False)
            async with self.phases.phase("intra_scale", "return"):
                await self._deactivate_leaving("intra_scale", self.config.deadlines.train_begin_s)
            if not self.store.table.training_owns_overlap:
                raise RuntimeError("overlap GPUs still held after deactivation")
            self.borrowing = False
            self._start_growth(wave, "train_begin")
        return {"step": step, "returned_gpus": returned, "elapsed_s": loop.time() - started}

    def _observe_step(self, now: float) -> None:
        step = self.executor.data_plane.close_step()
        lent_for = None
        if self.borrowing:
            lent_for = step.span_s if self._borrowed_since is None else now - self._borrowed_since
        members = self.store.table.members()
        usage = pool_usage(dict(step.worker_busy_s), span_s=step.span_s, borrowed_for_s=lent_for,
                           dedicated=[w.slot for w in members if w.zone is Zone.DEDICATED],
                           borrowed=[w.slot for w in members if w.zone is Zone.OVERLAP])
        self.learning, warning = self.learning.close(step.scaled(self.config.time_scale), now=now,
                                                     borrowed=self.borrowing, number=self.last_step["finished"],
                                                     usage=usage, teaches_toggle_cost=not self._overruled)
        self._overruled = False
        if warning:
            log.warning("%s", warning)

    async def train_finished(self, *, step: int, remaining: float | None = None,
                             request_id: str | None = None) -> dict[str, Any]:
        return await self._once("train_finished", request_id, {"step": step, "remaining": remaining},
                                lambda: self._train_finished(step, remaining))

    async def _train_finished(self, step: int, remaining: float | None) -> dict[str, Any]:
        async with self._lock:
            if not self.training and self.last_step["finished"] == step:
                return {"step": step, "borrowing": self.borrowing, "reason": "already finished",
                        "repeated_step": True}
            if not self.training:
                raise OutOfOrder(f"train_finished for step {step} without a train_begin")
            if step != self.last_step["begin"]:
                raise OutOfOrder(f"train_finished for step {step}, but step {self.last_step['begin']} is training")
            self.training = False
            self.last_step["finished"] = step
            await self.store.apply([TrainFinished()])
            borrow, reason = self._gate(remaining)
            self.borrowing = borrow
            self._borrowed_since = asyncio.get_running_loop().time() if borrow else None
            self._persist()
            if borrow:
                await self._regrow("train_finished", "intra_scale", borrow=True)
        return {"step": step, "borrowing": borrow, "reason": reason}

    def _gate(self, remaining: float | None) -> tuple[bool, str]:
        usage = self.learning.usage
        ok, reason, decision = policy.borrow(self.config, self.store.table, self.profile(),
                                             toggle_cost_s=self.learning.gate.toggle_cost_s, remaining=remaining,
                                             ctx=self._context(fresh=False), usage=usage)
        if decision is not None:
            gate, choice = self.learning.gate.choose(decision)
            self.learning = replace(self.learning, gate=gate)
            ok, reason = choice.borrow, choice.reason
            self._overruled = decision.overruled is not None and not choice.explored
            self.decisions.append({"operation": "borrow_gate", **choice.to_dict(),
                                   "pool_usage": None if usage is None else usage.to_dict()})
        return ok, reason

    async def gpus_join(self, *, gpus: tuple[str, ...], request_id: str | None = None) -> dict[str, Any]:
        return await self._once("gpus_join", request_id, {"gpus": list(gpus)}, lambda: self._gpus_join(gpus))

    async def _gpus_join(self, gpus: tuple[str, ...]) -> dict[str, Any]:
        """Answers once the growth that carries these GPUs (this join's, or the one of a
        later event that superseded it) has finished, with what happened to them."""
        async with self._lock:
            await self.store.apply([GpusJoin(tuple(gpus))])
            growth = await self._regrow("gpus_join", "inter_scale", borrow=self.borrowing)
        on_gpus = frozenset(gpus)
        outcome = await follow(growth, lock=self._lock, current=lambda: self._growth,
                               still_joining=lambda: bool(readied_on(self.store.table, on_gpus)))
        return join_answer(self.store.table, gpus, outcome)

    async def gpus_leave(self, *, gpus: tuple[str, ...], deadline_s: float,
                         request_id: str | None = None) -> dict[str, Any]:
        return await self._once("gpus_leave", request_id, {"gpus": list(gpus), "deadline_s": deadline_s},
                                lambda: self._gpus_leave(gpus, deadline_s))

    async def _gpus_leave(self, gpus: tuple[str, ...], deadline_s: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self._lock:
            await self._cancel_growth(by="gpus_leave")
            await self.store.apply([GpusLeave(tuple(gpus))])
            wave = await self._begin("gpus_leave", borrow=self.borrowing)
            async with self.phases.phase("inter_scale", "shrink"):
                # Leave time to stop stragglers and answer within the caller's deadline.
                removed = await self._deactivate_leaving("inter_scale", deadline_s * 0.8)
            self._start_growth(wave, "inter_scale")
        return {"action": "leave", "removed": removed, "elapsed_s": loop.time() - started}

    async def set_pd_mode(self, mode: PdMode) -> dict[str, Any]:
        """Operator override of the PD mode (``core.pd_mode``); the
        cluster is re-planned at once and the answer comes when the change is admitted (by
        this call's growth, or by the one of a later event that superseded it)."""
        async with self._lock:
            self.config = replace(self.config, pd_mode=mode)
            self.config.validate()
            growth = await self._regrow("pd_mode", "pd_mode", borrow=self.borrowing)
        outcome = await follow(growth, lock=self._lock, current=lambda: self._growth)
        reason = outcome.stopped() if outcome.growth is None else outcome.growth.reason
        waves = outcome.growth.waves if outcome.growth is not None else ()
        return {"pd_mode": mode, "topology": self.store.table.active_topology().label(), **outcome.describe(),
                **({"waves": list(waves)} if waves else {}), **({"reason": reason} if reason else {})}

    async def shutdown(self) -> None:
        if self._replan is not None:
            self._replan.cancel()
            await asyncio.gather(self._replan, return_exceptions=True)
        await self._cancel_growth(by="shutdown")
        await self.groups.close()

    def prediction_state(self) -> dict[str, Any]:
        """What the gate learned and how well the model predicted the finished steps."""
        return self.learning.describe()

    def state(self) -> dict[str, Any]:
        return {"decisions": list(self.decisions)[-10:], "phases": self.phases.summary(),
                "last_step": self.last_step, "recovery": self.recovery,
                "weights": self.snapshot.to_dict(), "weight_groups": self.groups.describe(),
                "pushes": {"number": self.pushes.number, "max_staleness": self.pushes.max_staleness,
                           "servable_versions": list(self.pushes.versions)},
                "training": self.training, "borrowing": self.borrowing,
                "toggle_cost_s": self.learning.gate.toggle_cost_s, "profile_steps": self.learning.tracker.steps,
                **self.prediction_state()}
