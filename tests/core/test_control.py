"""The control core: ``on_event(state, event, seen) -> (state, effects)``, with no shell."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pearl_sglang.core.control import (
    Answer, BeginTraining, BeginWave, ControlState, Decide, Decided, FinishTraining, GateAsked, GrowthBegun,
    GrowthEnded, OverlapReturned, PdModeSet, Persist, PushAdopted, Seen, StepClosed, on_event,
)
from pearl_sglang.core.errors import OutOfOrder
from pearl_sglang.core.events import BeginPlan, TrainFinished, apply, apply_all
from pearl_sglang.core.gate import ToggleCostEstimator
from pearl_sglang.core.learning_gate import Exploration, LearningGate
from pearl_sglang.core.mode_feedback import ModeCorrection, ModeFeedback
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.policy import DecisionConfig
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.state import StateTable
from pearl_sglang.core.step_learning import StepLearning
from pearl_sglang.core.step_model import MakespanModel
from pearl_sglang.core.telemetry import ProfileTracker, StepTelemetry
from pearl_sglang.core.topology import Topology
from pearl_sglang.core.weight_snapshot import WeightSnapshot

PROFILE = Profile(B=16, S=5, delta_L=200, r=50, theta=0.5, A=0.002, b=5e-5, t_prefill=2e-5, K=65536, BW=1.0,
                  T_over=0.0, T_env=1.0, K_seq=1.0, H_max=1.0)


def _state(**decisions) -> ControlState:
    return ControlState(
        config=DecisionConfig(profile=PROFILE, **decisions),
        learning=StepLearning(model=MakespanModel.parse("paper"), tracker=ProfileTracker(),
                              gate=LearningGate(ToggleCostEstimator(initial_s=30.0), Exploration(rate=0.0)),
                              modes=ModeCorrection(ModeFeedback())),
        snapshot=WeightSnapshot("v0"), pushes=PushLog.start("v0"))


def _table(dedicated: int = 2, overlap: int = 2) -> StateTable:
    return StateTable.create(tp_size=1, dedicated_gpus=[f"d:{i}" for i in range(dedicated)],
                             overlap_gpus=[f"t:{i}" for i in range(overlap)])


def _seen(table: StateTable, now: float = 0.0) -> Seen:
    return Seen(table, now)


def test_train_begin_is_ordered_and_a_repeat_answers_without_acting():
    table = _table()
    state, effects = on_event(_state(), BeginTraining(3), _seen(table))
    assert state.training and state.steps.begin == 3 and effects == (Persist(),)
    # Training owns the overlap GPUs (nothing borrowed them): the same step again is a repeat.
    again, effects = on_event(state, BeginTraining(3), _seen(table))
    assert again is state
    assert effects == (Answer({"step": 3, "returned_gpus": ["t:0", "t:1"], "elapsed_s": 0.0,
                               "repeated_step": True}),)
    with pytest.raises(OutOfOrder, match="step 3 is still training"):
        on_event(state, BeginTraining(4), _seen(table))


def test_train_finished_needs_its_begin_and_a_repeat_answers_already_finished():
    table = _table()
    with pytest.raises(OutOfOrder, match="without a train_begin"):
        on_event(_state(), FinishTraining(0), _seen(table))
    begun, _ = on_event(_state(), BeginTraining(0), _seen(table))
    with pytest.raises(OutOfOrder, match="but step 0 is training"):
        on_event(begun, FinishTraining(1), _seen(table))
    finished, effects = on_event(begun, FinishTraining(0), _seen(table))
    assert not finished.training and finished.steps.finished == 0 and effects == ()
    same, effects = on_event(finished, FinishTraining(0), _seen(table))
    assert same is finished and effects[0].body["reason"] == "already finished"


def test_a_decision_is_recorded_predicted_and_begun_as_a_plan():
    table = _table()
    state, effects = on_event(_state(pd_mode=PdMode("colocated")), Decide("bootstrap", borrow=False), _seen(table))
    decided = [e for e in effects if isinstance(e, Decided)]
    assert len(decided) == 1 and decided[0].record["operation"] == "bootstrap"
    assert decided[0].record["budget"] == 2
    wave = effects[-1]
    assert isinstance(wave, BeginWave) and wave.wave.plan.target == Topology(0, 0, 2)
    assert state.learning.prediction.topology == Topology(0, 0, 2)
    # The shell applies the plan; on the same table the next decision keeps the target.
    table = apply(table, BeginPlan(wave.wave.plan))
    assert len(table.rollout_workers()) == 2


def test_no_gpus_means_no_decision_and_an_empty_target():
    state, effects = on_event(_state(), Decide("gpus_leave", borrow=False), _seen(_table(dedicated=0, overlap=0)))
    assert not any(isinstance(e, Decided) for e in effects)
    assert effects[-1].wave.plan.target == Topology(0, 0, 0) and state.learning.prediction is None


def test_the_operator_pins_the_pd_mode_for_later_decisions():
    state, _ = on_event(_state(), PdModeSet(PdMode("1:1")), _seen(_table()))
    _, effects = on_event(state, Decide("pd_mode", borrow=False), _seen(_table()))
    assert effects[-1].wave.plan.target == Topology.pd(1, 1)


@pytest.mark.parametrize("decisions, borrows, reason", [
    ({"borrow": False}, False, "borrowing disabled"),
    ({"gated": False}, True, "ungated borrowing"),
])
def test_the_gate_answers_persists_and_remembers_when_it_borrowed(decisions, borrows, reason):
    table = apply_all(_table(), [TrainFinished()])
    state, _ = on_event(_state(**decisions), BeginTraining(0), _seen(table))
    state, _ = on_event(state, FinishTraining(0), _seen(table))
    state, effects = on_event(state, GateAsked(remaining=None), _seen(table, now=12.5))
    assert state.borrowing is borrows and state.borrowed_since == (12.5 if borrows else None)
    assert effects[-2:] == (Persist(), Answer({"borrowing": borrows, "reason": reason}))
    returned, _ = on_event(state, OverlapReturned(), _seen(table))
    assert not returned.borrowing


def test_closing_a_step_starts_the_next_and_clears_the_overrule():
    state = replace(_state(), overruled=True)
    state, effects = on_event(state, StepClosed(StepTelemetry(turns=())), _seen(_table(), now=40.0))
    assert state.learning.started_at == 40.0 and not state.overruled and effects == ()


def test_an_adopted_push_is_what_workers_sync_to_and_is_numbered():
    state, effects = on_event(_state(), PushAdopted(WeightSnapshot("v1", model_path="/ckpt/v1")), _seen(_table()))
    assert state.snapshot.version == "v1" and state.pushes.number == 1 and effects == (Persist(),)
    assert not state.pushes.servable("v0")


def test_the_intent_is_recorded_while_a_growth_runs():
    table = _table()
    _, effects = on_event(_state(pd_mode=PdMode("colocated")), Decide("bootstrap", borrow=False), _seen(table))
    p = effects[-1].wave.plan
    state, effects = on_event(_state(), GrowthBegun("bootstrap", p), _seen(table))
    assert state.intent == {"operation": "bootstrap", "plan": p.to_dict()} and effects == (Persist(),)
    state, _ = on_event(state, GrowthEnded(), _seen(table))
    assert state.intent is None


def test_the_same_events_give_the_same_state():
    def run() -> ControlState:
        table, state = apply_all(_table(), [TrainFinished()]), _state()
        for event, now in [(Decide("bootstrap", borrow=False), 0.0), (BeginTraining(0), 1.0),
                           (StepClosed(StepTelemetry(turns=())), 1.0), (FinishTraining(0), 5.0),
                           (GateAsked(remaining=4), 5.0), (Decide("train_finished", borrow=True), 5.0)]:
            state, _ = on_event(state, event, _seen(table, now))
        return state
    assert run() == run()


def test_lent_workers_serve_after_a_launch_until_the_overlap_gpus_keep_processes():
    from pearl_sglang.core.state import Activity, Role, WorkerRecord, Zone

    asked = GateAsked(None, launch_s=60.0, activation_s=6.0)
    assert asked.arrival_s(_table()) == 60.0  # nothing ever launched on the overlap GPUs
    kept = _table().put(WorkerRecord(7, ("t:0",), Zone.OVERLAP, Role.COLOCATED, Activity.INACTIVE))
    assert asked.arrival_s(kept) == 6.0  # a retained process resumes
    assert GateAsked(None, launch_s=60.0).arrival_s(kept) is None  # no resume measured yet


def test_the_replay_check_runs_before_a_kept_workers_resume_was_ever_measured():
    """The first borrow launched the lent workers, the next gate refused, and the one after
    that finds them kept with no resume measured: the last (unborrowed) step is still
    replayed, with the lent workers serving after T_toggle instead of not at all."""
    from pearl_sglang.core.borrow_replay import StepTimeline
    from pearl_sglang.core.state import Activity, Role, WorkerRecord, Zone

    table = apply_all(_table(), [TrainFinished()]).put(
        WorkerRecord(7, ("t:0",), Zone.OVERLAP, Role.COLOCATED, Activity.INACTIVE))
    state = _state()
    timeline = StepTimeline((((1.0, 20.0),) * 5,) * 4, span_s=105.0, workers=2)
    state = replace(state, learning=replace(state.learning, timeline=timeline))
    state, effects = on_event(state, GateAsked(None, launch_s=60.0, activation_s=None), _seen(table, 5.0))
    (noted,) = [e for e in effects if type(e).__name__ == "Noted"]
    assert noted.record["replay"]["join_after_s"] == pytest.approx(30.0)  # T_toggle of _state()
    measured, effects = on_event(replace(state, borrowing=False), GateAsked(None, launch_s=60.0, activation_s=6.0),
                                 _seen(table, 5.0))
    (noted,) = [e for e in effects if type(e).__name__ == "Noted"]
    assert noted.record["replay"]["join_after_s"] == pytest.approx(6.0)
