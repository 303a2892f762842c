"""The control plane's pure core: ``on_event(state, event, seen) -> (state, effects)``.

``ControlState`` is everything the control plane decides with and remembers between
events: whether training runs and whether rollout borrows its GPUs, the step numbers the
trainer sent, what it learned from finished steps (profile fit, toggle cost, per-mode
correction: ``StepLearning``), the adopted weight pushes and the snapshot joiners sync
to, the plan being executed (``intent``), and the configuration its decisions follow
(the PD mode an operator may override). It never changes in place.

Each event is one point of a control operation at which the shell hands the core what it
observed (``Seen``: the table, the time on the shell's clock, the data plane's turn
counts). The answer is the next state and what the shell must do: persist the state, add
a record to the decision log, log a line, begin a wave of a plan (``BeginWave``), or
answer the caller (``Answer``). The async shell (``control/orchestrator.py``) serializes
operations, runs the worker operations between events, and carries out the effects in
order; everything it decides comes from here. No I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Union

from pearl_sglang.core.errors import InvalidConfig, OutOfOrder
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.planner import Plan, plan
from pearl_sglang.core.policy import DecisionConfig, borrow, replayed, target_topology
from pearl_sglang.core.pool_usage import pool_usage
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.registered import locked_pd_mode, relaunch_lock
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.state import StateTable, Zone
from pearl_sglang.core.step_learning import StepLearning
from pearl_sglang.core.step_model import StepContext
from pearl_sglang.core.telemetry import StepTelemetry
from pearl_sglang.core.topology import Mode, Topology
from pearl_sglang.core.waves import Wave, first_wave
from pearl_sglang.core.weight_snapshot import WeightSnapshot

# Operations that decide for a fresh batch: a step's rollout starts with train_begin
# (staleness one: the next batch starts as training does); the others decide on the
# work left of the step in progress.
FRESH_BATCH = frozenset({"bootstrap", "recovery", "train_begin"})


@dataclass(frozen=True)
class Steps:
    """The trainer's step numbers of the last train_begin and train_finished."""

    begin: int | None = None
    finished: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        return {"begin": self.begin, "finished": self.finished}


@dataclass(frozen=True)
class ControlState:
    config: DecisionConfig
    learning: StepLearning
    snapshot: WeightSnapshot             # what joining and re-activated workers sync to
    pushes: PushLog                      # adopted pushes, numbered (the staleness bound)
    training: bool = False
    borrowing: bool = False
    steps: Steps = field(default_factory=Steps)
    borrowed_since: float | None = None  # shell-clock time of the last borrow
    overruled: bool = False              # the pool-usage check kept this step unborrowed
    intent: dict[str, Any] | None = None  # the plan being executed (crash safety)

    def profile(self) -> Profile:
        return self.config.fitted(self.learning.tracker)

    def context(self, seen: "Seen", *, fresh: bool) -> StepContext:
        """Where the rollout step stands: at its start a fresh batch; mid-step the turns
        each trajectory has done and the time it has run."""
        if fresh or self.learning.started_at is None:
            return self.learning.context()
        return self.learning.context(now=seen.now, turns_done=seen.turns_done(), profile=self.profile())


@dataclass(frozen=True)
class Seen:
    """What the shell observed when it hands the core an event. ``turns_done`` reads the
    data plane's turn counts at ``now`` (only mid-step decisions need them)."""

    table: StateTable
    now: float
    turns_done: Callable[[], tuple[int, ...]] = tuple


# -- events ------------------------------------------------------------------------------

@dataclass(frozen=True)
class BeginTraining:
    """``/train_begin`` for ``step``, before anything is touched."""

    step: int


@dataclass(frozen=True)
class StepClosed:
    """The data plane handed over the step that just ended (its telemetry, shell seconds)."""

    telemetry: StepTelemetry


@dataclass(frozen=True)
class OverlapReturned:
    """Every rollout worker on the training GPUs is gone: training owns them again."""


@dataclass(frozen=True)
class FinishTraining:
    """``/train_finished`` for ``step``, before anything is touched."""

    step: int


@dataclass(frozen=True)
class GateAsked:
    """Training finished and the table says so: borrow its GPUs? (``remaining``: the
    trainer's count of trajectories left, if it sent one; ``launch_s`` and
    ``activation_s``: the mean measured time of a worker launch and of a kept worker's
    memory resume and weight sync, shell seconds, None when never measured)."""

    remaining: float | None
    launch_s: float | None = None
    activation_s: float | None = None

    def arrival_s(self, table: StateTable) -> float | None:
        """How long lent workers take to serve: an activation when the overlap GPUs kept
        their processes (retained workers in the table), else a launch."""
        kept = any(w.zone is Zone.OVERLAP for w in table.rollout_workers())
        return self.activation_s if kept else self.launch_s


@dataclass(frozen=True)
class Decide:
    """Choose a target for ``operation`` on the GPUs available (the training GPUs too
    when ``borrow``) and begin the first wave of the plan that reaches it."""

    operation: str
    borrow: bool


@dataclass(frozen=True)
class NextWave:
    """A staged change's wave was admitted: begin the next one, toward the same target."""

    done: Wave
    operation: str


@dataclass(frozen=True)
class GrowthBegun:
    operation: str
    plan: Plan


@dataclass(frozen=True)
class GrowthEnded:
    pass


@dataclass(frozen=True)
class PushAdopted:
    """Some worker loaded ``snapshot``: it is what workers sync to from now on."""

    snapshot: WeightSnapshot


@dataclass(frozen=True)
class PdModeSet:
    mode: PdMode


@dataclass(frozen=True)
class Recovered:
    """The restart path read the crash-safe record back (``reported``: the weight
    versions the reconciled workers report)."""

    snapshot: WeightSnapshot
    pushes: dict[str, Any] | None
    training: bool
    borrowing: bool
    steps: Steps
    reported: tuple[str, ...]
    pd_mode: PdMode | None = None  # the mode in force before the restart (None: the config's)


Event = Union[BeginTraining, StepClosed, OverlapReturned, FinishTraining, GateAsked, Decide, NextWave,
              GrowthBegun, GrowthEnded, PushAdopted, PdModeSet, Recovered]


# -- effects -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Persist:
    """Write the crash-safe record now."""


@dataclass(frozen=True)
class Decided:
    """A decision: into the decision log and to the decision callback."""

    record: dict[str, Any]


@dataclass(frozen=True)
class Noted:
    """A record for the decision log alone (a staged wave, the borrowing gate's choice)."""

    record: dict[str, Any]


@dataclass(frozen=True)
class Logged:
    level: str  # "info" or "warning"
    message: str


@dataclass(frozen=True)
class BeginWave:
    """Apply ``BeginPlan(wave.plan)`` to the table; a growth then runs the wave."""

    wave: Wave


@dataclass(frozen=True)
class Answer:
    """What the operation answers its caller (an operation repeated: all it does)."""

    body: dict[str, Any]


Effect = Union[Persist, Decided, Noted, Logged, BeginWave, Answer]
Effects = tuple[Effect, ...]


# -- transitions -------------------------------------------------------------------------

def on_event(state: ControlState, event: Event, seen: Seen) -> tuple[ControlState, Effects]:
    """The next state and what the shell must do; raises ``OutOfOrder`` for a call that
    contradicts the training state, ``InvalidConfig`` for a bad PD mode."""
    return _HANDLERS[type(event)](state, event, seen)


def _begin_training(state: ControlState, e: BeginTraining, seen: Seen) -> tuple[ControlState, Effects]:
    if state.training and state.steps.begin == e.step and seen.table.training_owns_overlap:
        return state, (Answer({"step": e.step, "returned_gpus": sorted(seen.table.overlap_gpus),
                               "elapsed_s": 0.0, "repeated_step": True}),)
    if state.training:
        raise OutOfOrder(f"train_begin for step {e.step} while step {state.steps.begin} "
                         "is still training (call train_finished first)")
    return replace(state, training=True, steps=replace(state.steps, begin=e.step)), (Persist(),)


def _step_closed(state: ControlState, e: StepClosed, seen: Seen) -> tuple[ControlState, Effects]:
    """Close the step (its time, telemetry, and the prediction made for it) before the
    next rollout's topology is decided."""
    step, learning = e.telemetry, state.learning
    lent_for = None
    if state.borrowing:
        lent_for = step.span_s if state.borrowed_since is None else seen.now - state.borrowed_since
    members = seen.table.members()
    usage = pool_usage(dict(step.worker_busy_s), span_s=step.span_s, borrowed_for_s=lent_for,
                       dedicated=[w.slot for w in members if w.zone is Zone.DEDICATED],
                       borrowed=[w.slot for w in members if w.zone is Zone.OVERLAP])
    learning, warning = learning.close(step.scaled(learning.time_scale), now=seen.now, borrowed=state.borrowing,
                                       number=state.steps.finished, usage=usage,
                                       teaches_toggle_cost=not state.overruled,
                                       dedicated_workers=seen.table.budget(frozenset(seen.table.dedicated_gpus)))
    effects = (Logged("warning", warning),) if warning else ()
    return replace(state, learning=learning, overruled=False), effects


def _overlap_returned(state: ControlState, e: OverlapReturned, seen: Seen) -> tuple[ControlState, Effects]:
    return replace(state, borrowing=False), ()


def _finish_training(state: ControlState, e: FinishTraining, seen: Seen) -> tuple[ControlState, Effects]:
    if not state.training and state.steps.finished == e.step:
        return state, (Answer({"step": e.step, "borrowing": state.borrowing, "reason": "already finished",
                               "repeated_step": True}),)
    if not state.training:
        raise OutOfOrder(f"train_finished for step {e.step} without a train_begin")
    if e.step != state.steps.begin:
        raise OutOfOrder(f"train_finished for step {e.step}, but step {state.steps.begin} is training")
    return replace(state, training=False, steps=replace(state.steps, finished=e.step)), ()


def _gate(state: ControlState, e: GateAsked, seen: Seen) -> tuple[ControlState, Effects]:
    learning, usage = state.learning, state.learning.usage
    ctx = state.context(seen, fresh=False)
    # Never measured (kept workers not yet resumed once, or no launch since a restart): the
    # lent workers are taken to serve after T_toggle, the gate's own cost of a toggle, so the
    # replay still runs and stays optimistic (the demo's measured resumes took 10-14 s
    # against its T_toggle of 9.44).
    arrival = e.arrival_s(seen.table)
    join_after = ctx.elapsed_s + (learning.gate.toggle_cost_s if arrival is None else arrival * learning.time_scale)
    replay = replayed(state.config, seen.table, state.profile(), learning.timeline, join_after_s=join_after)
    ok, reason, decision = borrow(state.config, seen.table, state.profile(),
                                  toggle_cost_s=learning.gate.toggle_cost_s, remaining=e.remaining,
                                  ctx=ctx, usage=usage, replay=replay)
    effects: Effects = ()
    overruled = state.overruled
    if decision is not None:
        gate, choice = learning.gate.choose(decision)
        learning = replace(learning, gate=gate)
        ok, reason = choice.borrow, choice.reason
        overruled = decision.overruled is not None and not choice.explored
        effects = (Noted({"operation": "borrow_gate", **choice.to_dict(),
                          "pool_usage": None if usage is None else usage.to_dict(),
                          "replay": None if replay is None else replay.to_dict()}),)
    state = replace(state, learning=learning, overruled=overruled, borrowing=ok,
                    borrowed_since=seen.now if ok else None)
    return state, effects + (Persist(), Answer({"borrowing": ok, "reason": reason}))


def _available(table: StateTable, *, borrow: bool) -> frozenset[str]:
    """The GPUs a plan may use: the training GPUs too when borrowing (and rollout owns them)."""
    return table.available_gpus() if borrow else frozenset(table.dedicated_gpus)


def _decide(state: ControlState, e: Decide, seen: Seen) -> tuple[ControlState, Effects]:
    table = seen.table
    available = _available(table, borrow=e.borrow)
    budget = table.budget(available)
    effects: Effects = ()
    target = Topology(0, 0, 0)
    if budget:
        lock = relaunch_lock(table)
        config = replace(state.config, pd_mode=locked_pd_mode(state.config.pd_mode, lock))
        ctx = state.context(seen, fresh=e.operation in FRESH_BATCH)
        profile, modes = state.profile(), state.learning.modes
        decision = target_topology(config, table, profile, budget, ctx, modes)
        record = {"operation": e.operation, "budget": budget, "makespan_model": config.makespan_model,
                  "mode_factors": {m.value: modes.factor(m) for m in Mode}, **decision.to_dict()}
        if lock is not None:
            record["mode_lock"] = lock.to_dict()
        state = replace(state, learning=state.learning.predicted(profile, decision.choice, ctx))
        effects, target = (Decided(record),), decision.choice
    return state, effects + _begin_wave(e.operation, table, plan(table, target, available=available))


def _next_wave(state: ControlState, e: NextWave, seen: Seen) -> tuple[ControlState, Effects]:
    """The rest of a staged change, planned from the table as it is now (the same target:
    the change was decided once)."""
    available = _available(seen.table, borrow=state.borrowing)
    return state, _begin_wave(f"{e.operation}_wave", seen.table,
                              plan(seen.table, e.done.plan.target, available=available))


def _begin_wave(operation: str, table: StateTable, p: Plan) -> Effects:
    """Begin the part of ``p`` that keeps a serving path of the old topology up while it
    runs (``core/waves.py``); the growth plans the rest once it is admitted."""
    wave = first_wave(table, p)
    effects: Effects = ()
    if wave.staged or not wave.keeps_serving:
        effects = (Noted({"operation": operation, "wave": wave.to_dict()}),)
        if wave.keeps_serving:
            effects += (Logged("info", f"{operation}: relaunching {len(wave.plan.switch)} worker(s) first, "
                                             f"{len(wave.deferred)} once they serve (the old topology serves "
                                             "meanwhile)"),)
        else:
            effects += (Logged("warning", f"{operation}: no serving path of the old topology can be kept "
                                                "during this change; nothing serves until the first "
                                                f"{len(wave.plan.switch)} relaunched worker(s) are ready"),)
    return effects + (BeginWave(wave),)


def _growth_begun(state: ControlState, e: GrowthBegun, seen: Seen) -> tuple[ControlState, Effects]:
    return replace(state, intent={"operation": e.operation, "plan": e.plan.to_dict()}), (Persist(),)


def _growth_ended(state: ControlState, e: GrowthEnded, seen: Seen) -> tuple[ControlState, Effects]:
    return replace(state, intent=None), (Persist(),)


def _push_adopted(state: ControlState, e: PushAdopted, seen: Seen) -> tuple[ControlState, Effects]:
    return replace(state, pushes=state.pushes.adopt(e.snapshot.version), snapshot=e.snapshot), (Persist(),)


def _pd_mode_set(state: ControlState, e: PdModeSet, seen: Seen) -> tuple[ControlState, Effects]:
    if not isinstance(e.mode, PdMode):
        raise InvalidConfig(f"pd_mode must be a PdMode, got {e.mode!r}", key="pd_mode")
    return replace(state, config=replace(state.config, pd_mode=e.mode)), (Persist(),)


def _recovered(state: ControlState, e: Recovered, seen: Seen) -> tuple[ControlState, Effects]:
    bound = state.pushes.max_staleness
    pushes = (PushLog.from_dict(e.pushes, max_staleness=bound, also=e.reported) if e.pushes else
              PushLog.start(e.snapshot.version, max_staleness=bound, also=e.reported))
    config = state.config if e.pd_mode is None else replace(state.config, pd_mode=e.pd_mode)
    return replace(state, config=config, snapshot=e.snapshot, pushes=pushes, training=e.training,
                   borrowing=e.borrowing, steps=e.steps), ()


_HANDLERS: dict[type, Callable[[ControlState, Any, Seen], tuple[ControlState, Effects]]] = {
    BeginTraining: _begin_training, StepClosed: _step_closed, OverlapReturned: _overlap_returned,
    FinishTraining: _finish_training, GateAsked: _gate, Decide: _decide, NextWave: _next_wave,
    GrowthBegun: _growth_begun, GrowthEnded: _growth_ended, PushAdopted: _push_adopted,
    PdModeSet: _pd_mode_set, Recovered: _recovered,
}
