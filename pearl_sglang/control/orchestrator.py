"""The elastic control plane's async shell: every event goes budget -> decision -> plan -> executor.

Events (train_begin, train_finished, GPUs join, GPUs leave, weight pushes, the PD-mode
override) are serialized by one lock. Each hands the pure core (``core.control``) what it
observes and carries out what the core answers: the core owns the control state and
every decision (the target under the new budget, the borrowing gate, the wave of a
minimal-change plan to begin, what a step taught); this shell owns the I/O between them,
so concurrent events never act on stale state. Execution is asynchronous. Mandatory work
(returning training GPUs, giving back reclaimed GPUs) is awaited before the event answers
and first cancels optional growth in flight (borrowing, expansion); optional growth runs
in the background and admits its workers all at once or not at all (``growth.py``). A
colocated <-> PD change is begun in waves that keep the old topology serving while the
first new workers start (``core/waves.py``). Callers that wait for a growth follow it to
the growth that superseded it (``expansions.py``).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import asdict
from typing import Any, Callable

from pearl_sglang.aio import gather_settled
from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.control.executor import PlanExecutor
from pearl_sglang.control.expansions import follow, join_answer, readied_on
from pearl_sglang.control.growth import Growths
from pearl_sglang.control.idempotency import OnceByRequestId
from pearl_sglang.control.persistence import ControlRecord, StateFile
from pearl_sglang.control.phases import PhaseLog
from pearl_sglang.control.reconcile import reconcile
from pearl_sglang.control.weight_group import GroupSpec, TensorSpecs, WeightGroups
from pearl_sglang.control.weight_pushes import NoActiveWorker, WeightLoading
from pearl_sglang.control.weights import loadable
from pearl_sglang.core.control import (
    Answer, BeginTraining, BeginWave, ControlState, Decide, Decided, Effects, Event, FinishTraining, GateAsked,
    Logged, NextWave, Noted, OverlapReturned, PdModeSet, Persist, PushAdopted, Recovered, Seen, StepClosed,
    Steps, on_event,
)
from pearl_sglang.core.events import (
    BeginPlan, GpusJoin, GpusLeave, TrainBegin, TrainFinished, WeightsUpdated, WorkerLost, apply_all,
)
from pearl_sglang.core.gate import ToggleCostEstimator
from pearl_sglang.core.learning_gate import Exploration, LearningGate
from pearl_sglang.core.mode_feedback import ModeCorrection
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.state import Activity, OverlapOwner, StateTable, Zone
from pearl_sglang.core.step_learning import StepLearning
from pearl_sglang.core.step_model import MakespanModel
from pearl_sglang.core.telemetry import ProfileTracker
from pearl_sglang.core.waves import Wave
from pearl_sglang.core.weight_snapshot import WeightSnapshot

log = logging.getLogger("pearl.control")


def initial_state(config: ClusterConfig) -> ControlState:
    """Nothing learned yet; until the trainer pushes, the launch checkpoint is the
    snapshot to (re)load from."""
    gate = config.gate
    snapshot = WeightSnapshot(version=config.engine.weight_version, model_path=config.engine.model_path or None)
    return ControlState(
        config=config.decisions,
        learning=StepLearning(
            model=MakespanModel.parse(config.makespan_model), tracker=ProfileTracker(alpha=gate.alpha),
            gate=LearningGate(ToggleCostEstimator(initial_s=gate.toggle_cost_s, alpha=gate.alpha),
                              Exploration(rate=gate.exploration_rate,
                                          max_benefit_ratio=gate.explore_max_benefit_ratio)),
            modes=ModeCorrection(config.mode_feedback), time_scale=config.time_scale),
        snapshot=snapshot,
        pushes=PushLog.start(snapshot.version, max_staleness=config.weights.max_staleness))


class Orchestrator:
    def __init__(self, *, config: ClusterConfig, executor: PlanExecutor, state_file: StateFile | None = None,
                 on_decision: Callable[[dict[str, Any]], None] = lambda d: None) -> None:
        self.config = config
        self.executor = executor
        self.store = executor.store
        self.phases: PhaseLog = executor.phases
        self.on_decision = on_decision
        self.state = initial_state(config)
        self.groups = WeightGroups(executor.ops, init_timeout_s=config.weights.group_init_timeout_s)
        self.weights = WeightLoading(executor, self.groups)
        self.growths = Growths(shell=self, executor=executor, weights=self.weights, recovery=config.recovery)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=50)
        self.lock = asyncio.Lock()
        self._once = OnceByRequestId().run
        self.state_file = state_file
        self.recovery: dict[str, Any] | None = None
        self.store.on_change(lambda old, new: self._persist())
        watch = getattr(executor.launcher, "watch", None)
        if watch is not None:
            watch(self._persist)

    # -- the core ------------------------------------------------------------------------
    def on(self, event: Event, *, now: float | None = None) -> Effects:
        """Hand the core ``event`` with what this shell sees now; carry out the effects
        that need no waiting and return them all (the caller begins waves, answers)."""
        now = asyncio.get_running_loop().time() if now is None else now
        seen = Seen(self.store.table, now, lambda: tuple(self.executor.data_plane.turns_done(now)))
        self.state, effects = on_event(self.state, event, seen)
        for effect in effects:
            if isinstance(effect, Persist):
                self._persist()
            elif isinstance(effect, Decided):
                self.decisions.append(effect.record)
                self.on_decision(effect.record)
            elif isinstance(effect, Noted):
                self.decisions.append(effect.record)
            elif isinstance(effect, Logged):
                getattr(log, effect.level)("%s", effect.message)
        return effects

    async def begin(self, operation: str, *, borrow: bool) -> Wave:
        """Decide and begin the first wave of a plan on the current snapshot; the caller
        holds ``lock``."""
        return await self._begin_wave(self.on(Decide(operation, borrow)))

    async def next_wave(self, done: Wave, operation: str) -> Wave:
        """The rest of a staged change. An event that arrives meanwhile cancels the
        growth while it waits for the lock, and re-plans itself."""
        async with self.lock:
            return await self._begin_wave(self.on(NextWave(done, operation)))

    async def _begin_wave(self, effects: Effects) -> Wave:
        wave = next(e.wave for e in effects if isinstance(e, BeginWave))
        await self.store.apply([BeginPlan(wave.plan)])
        return wave

    @staticmethod
    def _answer(effects: Effects) -> dict[str, Any] | None:
        return next((e.body for e in effects if isinstance(e, Answer)), None)

    # -- what tests and /pearl/state read ------------------------------------------------
    @property
    def training(self) -> bool:
        return self.state.training

    @property
    def borrowing(self) -> bool:
        return self.state.borrowing

    @property
    def last_step(self) -> dict[str, int | None]:
        return self.state.steps.to_dict()

    @property
    def learning(self) -> StepLearning:
        return self.state.learning

    @property
    def snapshot(self) -> WeightSnapshot:
        return self.state.snapshot

    @property
    def pushes(self) -> PushLog:
        return self.state.pushes

    @property
    def tracker(self) -> ProfileTracker:
        """The profile fit (a new object with each fit: the router reprices placement on it)."""
        return self.state.learning.tracker

    def profile(self) -> Profile:
        """The configured profile with the symbols telemetry has identified replaced."""
        return self.state.profile()

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
        st = self.state
        self.state_file.save(ControlRecord(
            table=self.store.table.to_dict(), snapshot=st.snapshot.to_dict(), training=st.training,
            borrowing=st.borrowing, last_step=st.steps.to_dict(), workers=workers, intent=st.intent,
            pushes=st.pushes.to_dict(), pd_mode=str(st.config.pd_mode)))

    async def _recover(self, record: ControlRecord) -> None:
        """Restart path: reconcile the recorded table with reality, then finish or roll
        back what was in flight and continue from the reconciled state."""
        result = await reconcile(StateTable.from_dict(record.table), record.workers, self.executor.ops)
        adopt = getattr(self.executor.launcher, "adopt", None)
        for slot, pid in result.adopted.items():
            if adopt is not None:
                adopt(slot, pid)
        self.on(Recovered(
            snapshot=WeightSnapshot.from_dict(record.snapshot), pushes=record.pushes, training=record.training,
            borrowing=record.borrowing, steps=Steps(**record.last_step),
            pd_mode=PdMode(record.pd_mode) if record.pd_mode is not None else None,
            reported=tuple(sorted({w.weight_version for w in result.table.active() if w.weight_version}))))
        self.recovery = {"intent": record.intent, "notes": result.notes}
        async with self.lock:
            async with self.store.lock:
                self.store.replace_locked(result.table)
            await self._deactivate_leaving("recovery", self.config.deadlines.train_begin_s)
            wave = await self.begin("recovery", borrow=self.state.borrowing and not self.state.training)
        await self.growths.grow_with_retries(wave, "recovery")

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
        async with self.lock:
            wave = await self.begin("bootstrap", borrow=False)
        return list((await self.growths.grow_with_retries(wave, "bootstrap")).admitted)

    async def train_begin(self, *, step: int, request_id: str | None = None) -> dict[str, Any]:
        """Without a ``request_id`` too, the call goes on when its caller stops waiting (a
        504), and a retry of ``step`` while it runs waits for its answer."""
        return await self._once("train_begin", request_id or f"(step {step}, no request_id)", {"step": step},
                                lambda: self._train_begin(step), remember=request_id is not None)

    async def _train_begin(self, step: int) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self.lock:
            repeated = self._answer(self.on(BeginTraining(step), now=started))
            if repeated is not None:
                return repeated
            # The batch is complete: close the step before deciding the next rollout's
            # topology, which starts now.
            self.on(StepClosed(self.executor.data_plane.close_step()), now=started)
            await self.growths.cancel(by="train_begin")
            returned = sorted(self.store.table.overlap_gpus)
            if self.store.table.overlap_owner is OverlapOwner.ROLLOUT:
                await self.store.apply([TrainBegin()])
            wave = await self.begin("train_begin", borrow=False)
            async with self.phases.phase("intra_scale", "return"):
                await self._deactivate_leaving("intra_scale", self.config.deadlines.train_begin_s)
            if not self.store.table.training_owns_overlap:
                raise RuntimeError("overlap GPUs still held after deactivation")
            self.on(OverlapReturned())
            self.growths.start(wave, "train_begin")
        return {"step": step, "returned_gpus": returned, "elapsed_s": loop.time() - started}

    async def train_finished(self, *, step: int, remaining: float | None = None,
                             request_id: str | None = None) -> dict[str, Any]:
        return await self._once("train_finished", request_id, {"step": step, "remaining": remaining},
                                lambda: self._train_finished(step, remaining))

    async def _train_finished(self, step: int, remaining: float | None) -> dict[str, Any]:
        async with self.lock:
            before = self.state
            repeated = self._answer(self.on(FinishTraining(step)))
            if repeated is not None:
                return repeated
            try:
                await self.store.apply([TrainFinished()])
            except Exception:
                self.state = before  # a train_finished the table refuses leaves the step training
                raise
            answer = self._answer(self.on(GateAsked(remaining, launch_s=self.lent_s("preparation"),
                                                    activation_s=self.lent_s("activation"))))
            if answer["borrowing"]:
                await self.growths.regrow("train_finished", "intra_scale", borrow=True)
        return {"step": step, **answer}

    def lent_s(self, phase: str) -> float | None:
        """How long ``phase`` (a launch's ``preparation``, a kept worker's ``activation``) takes
        for lent workers: their own (workers on the overlap GPUs, whichever operation started
        them) once measured; before that, any worker's (the dedicated workers' start-up, a
        preemptible worker's resume). On the emulator lent workers start while rollout runs:
        their launches took 1.9x and 4.3x the start-up's time in two demo runs."""
        own = self.phases.mean_s(phase, zone=Zone.OVERLAP.value)
        return own if own is not None else self.phases.mean_s(phase)

    async def gpus_join(self, *, gpus: tuple[str, ...], request_id: str | None = None) -> dict[str, Any]:
        return await self._once("gpus_join", request_id, {"gpus": list(gpus)}, lambda: self._gpus_join(gpus))

    async def _gpus_join(self, gpus: tuple[str, ...]) -> dict[str, Any]:
        """Answers once the growth that carries these GPUs (this join's, or the one of a
        later event that superseded it) has finished, with what happened to them."""
        async with self.lock:
            await self.store.apply([GpusJoin(tuple(gpus))])
            growth = await self.growths.regrow("gpus_join", "inter_scale", borrow=self.state.borrowing)
        on_gpus = frozenset(gpus)
        outcome = await follow(growth, lock=self.lock, current=lambda: self.growths.current,
                               still_joining=lambda: bool(readied_on(self.store.table, on_gpus)))
        return join_answer(self.store.table, gpus, outcome)

    async def gpus_leave(self, *, gpus: tuple[str, ...], deadline_s: float,
                         request_id: str | None = None) -> dict[str, Any]:
        return await self._once("gpus_leave", request_id, {"gpus": list(gpus), "deadline_s": deadline_s},
                                lambda: self._gpus_leave(gpus, deadline_s))

    async def _gpus_leave(self, gpus: tuple[str, ...], deadline_s: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self.lock:
            apply_all(self.store.table, [GpusLeave(tuple(gpus))])  # a leave the table refuses stops nothing
            await self.growths.cancel(by="gpus_leave")
            await self.store.apply([GpusLeave(tuple(gpus))])
            wave = await self.begin("gpus_leave", borrow=self.state.borrowing)
            async with self.phases.phase("inter_scale", "shrink"):
                # Leave time to stop stragglers and answer within the caller's deadline.
                removed = await self._deactivate_leaving("inter_scale", deadline_s * 0.8)
            self.growths.start(wave, "inter_scale")
        return {"action": "leave", "removed": removed, "elapsed_s": loop.time() - started}

    async def set_pd_mode(self, mode: PdMode) -> dict[str, Any]:
        """Operator override of the PD mode (``core.pd_mode``); the
        cluster is re-planned at once and the answer comes when the change is admitted (by
        this call's growth, or by the one of a later event that superseded it)."""
        async with self.lock:
            self.on(PdModeSet(mode))
            growth = await self.growths.regrow("pd_mode", "pd_mode", borrow=self.state.borrowing)
        outcome = await follow(growth, lock=self.lock, current=lambda: self.growths.current)
        reason = outcome.stopped() if outcome.growth is None else outcome.growth.reason
        waves = outcome.growth.waves if outcome.growth is not None else ()
        return {"pd_mode": mode, "topology": self.store.table.active_topology().label(), **outcome.describe(),
                **({"waves": list(waves)} if waves else {}), **({"reason": reason} if reason else {})}

    # -- weights -------------------------------------------------------------------------
    async def update_weights(self, *, snapshot: WeightSnapshot, tensors: TensorSpecs | None = None,
                             request_id: str | None = None) -> dict[str, Any]:
        """Push ``snapshot`` from disk, or, with ``tensors``, receive it over the
        distributed group ``snapshot.group`` while the trainer broadcasts."""
        params = {"snapshot": asdict(snapshot), "tensors": asdict(tensors) if tensors is not None else None}
        return await self._once("update_weights", request_id, params, lambda: self._update_weights(snapshot, tensors))

    async def _update_weights(self, snapshot: WeightSnapshot, tensors: TensorSpecs | None) -> dict[str, Any]:
        """Pushes run one at a time, in arrival order; the snapshot joiners sync to becomes
        ``snapshot`` only once some worker has loaded it (a push nobody could load
        changes nothing), so a racing bad push can neither replace the latest good one
        nor roll it back. One exception: no worker serves and none could start, because
        the kept weights came over a group without a disk copy; a disk push is then the
        only way back, so it is adopted unchecked and workers are planned at it."""
        unchecked = False
        async with self.weights.lock:
            try:
                results = await self.weights.push(snapshot, tensors, keeping=self.state.snapshot)
            except NoActiveWorker:
                if tensors is not None or loadable(self.state.snapshot):
                    raise
                results, unchecked = {}, True
            ok = tuple(slot for slot, r in results.items() if r == "ok")
            if ok or unchecked:
                async with self.store.lock:  # the table and the push log change together
                    # A worker may have left while it loaded (a preemption): record only those still here.
                    here = tuple(s for s in ok if self.store.table.has(s))
                    if here:
                        self.store.apply_locked([WeightsUpdated(here, snapshot.version)])
                    self.on(PushAdopted(snapshot))
            answer = {"version": snapshot.version, "latest": self.state.snapshot.version,
                      "applied": bool(ok) or unchecked, "workers": {str(slot): r for slot, r in results.items()},
                      "push": self.state.pushes.number}
        if unchecked:
            log.warning("no worker serves and the kept weights had no disk copy: %s adopted unchecked; "
                        "starting workers at it", snapshot.version)
            async with self.lock:
                await self.growths.regrow("weights_repair", "weights_repair", borrow=self.state.borrowing)
            return {**answer, "unchecked": True}
        await self._repair_stale()
        return answer

    async def _repair_stale(self) -> None:
        """A worker beyond the staleness bound (by default: any that missed the last
        adopted push) must not serve: it leaves, and a new plan brings a replacement up at
        the latest snapshot on the same GPUs."""
        if all(self.state.pushes.servable(w.weight_version) for w in self.store.table.active()):
            return
        async with self.lock:  # decided on the table as it is under the lock
            stale = [w.slot for w in self.store.table.active() if not self.state.pushes.servable(w.weight_version)]
            if not stale:
                return
            await self.store.apply([WorkerLost(s) for s in stale])
            for s in stale:
                await self.executor.kill(s)
            await self.growths.regrow("weights_repair", "weights_repair", borrow=self.state.borrowing)

    async def weight_group(self, *, spec: GroupSpec | None = None, destroy: str | None = None,
                           request_id: str | None = None) -> dict[str, Any]:
        """Create ``spec`` (members: the active workers now) or destroy the group named
        ``destroy``."""
        async def act() -> dict[str, Any]:
            if spec is None:
                return await self.groups.destroy(destroy or "")
            async with self.lock:
                return self.groups.init(spec, self.store.table.active(), self.config.engine.tp_size)
        params = {"spec": asdict(spec) if spec is not None else None, "destroy": destroy}
        return await self._once("weight_group", request_id, params, act)

    # -- lifecycle and reports -----------------------------------------------------------
    async def shutdown(self) -> None:
        await self.growths.close()
        await self.groups.close()

    def prediction_state(self) -> dict[str, Any]:
        """What the gate learned and how well the model predicted the finished steps."""
        return self.state.learning.describe()

    def state_report(self) -> dict[str, Any]:
        st = self.state
        return {"decisions": list(self.decisions)[-10:], "phases": self.phases.summary(),
                "last_step": st.steps.to_dict(), "recovery": self.recovery,
                "weights": st.snapshot.to_dict(), "weight_groups": self.groups.describe(),
                "pushes": {"number": st.pushes.number, "max_staleness": st.pushes.max_staleness,
                           "servable_versions": list(st.pushes.versions)},
                "training": st.training, "borrowing": st.borrowing, "pd_mode": str(st.config.pd_mode),
                "toggle_cost_s": st.learning.gate.toggle_cost_s, "profile_steps": st.learning.tracker.steps,
                **self.prediction_state()}
