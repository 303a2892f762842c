"""What the control plane learns from finished steps, as one pure value: the record of
predicted vs observed, and what the gate and the mode correction learn from it."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl_sglang.core.gate import ToggleCostEstimator
from pearl_sglang.core.learning_gate import LearningGate
from pearl_sglang.core.mode_feedback import ModeCorrection, ModeFeedback
from pearl_sglang.core.pool_usage import PoolUsage
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.step_learning import HISTORY, StepLearning
from pearl_sglang.core.step_model import MakespanModel, step_predictions
from pearl_sglang.core.telemetry import ProfileTracker, StepTelemetry
from pearl_sglang.core.topology import Mode, Topology

from tests.core.test_decision import P

EMPTY = StepTelemetry(turns=())


def fresh(model=MakespanModel.PAPER, time_scale=1.0) -> StepLearning:
    return StepLearning(model=model, tracker=ProfileTracker(alpha=0.3),
                        gate=LearningGate(ToggleCostEstimator(initial_s=10.0, alpha=0.3)),
                        modes=ModeCorrection(), time_scale=time_scale)


def test_a_step_without_a_prediction_only_starts_the_next():
    learning, warning = fresh().close(EMPTY, now=5.0, borrowed=False, number=None)
    assert warning is None and learning.started_at == 5.0 and learning.history == ()
    assert learning.context().remaining is None  # no clock given: a fresh batch


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1e4), st.floats(0.1, 1e4), st.sampled_from([1.0, 20.0]), st.booleans(),
       st.sampled_from(list(MakespanModel)))
def test_closing_records_the_configured_models_prediction_and_teaches_the_gate_and_the_modes(
        start, length, scale, borrowed, model):
    topo = Topology.pd(2, 4)
    learning, _ = fresh(model, scale).close(EMPTY, now=start, borrowed=False, number=None)
    learning = learning.predicted(P, topo, learning.context())
    predicted = step_predictions(P, topo, learning.context())[model.value]
    assert learning.predicted_s == pytest.approx(predicted)
    closed, _ = learning.close(EMPTY, now=start + length, borrowed=borrowed, number=7)
    (record,) = closed.history
    observed = ((start + length) - start) * scale  # as the clock difference, to the last bit
    assert record["step"] == 7 and record["borrowed"] is borrowed and record["mode"] == "disaggregated"
    assert record["observed_s"] == pytest.approx(observed) and record["predicted_s"] == pytest.approx(predicted)
    # nothing learned before this step: the PD prior alone
    assert record["corrected_s"] == pytest.approx(predicted * ModeFeedback().pd_prior)
    assert set(record["predicted_by_model_s"]) == {"paper", "tail"}
    # The profile the models predicted with (fitted symbols included), to explain an error.
    assert Profile.from_dict(record["profile"]) == P
    assert closed.modes == learning.modes.observe(Mode.DISAGGREGATED, observed_s=observed, predicted_s=predicted)
    assert closed.gate == learning.gate.observe(borrowed=borrowed, observed_s=observed, predicted_s=predicted)
    assert closed.started_at == start + length and closed.describe()["step_predictions"] == [record]
    # A step the pool-usage check kept unborrowed is recorded but teaches no toggle cost,
    # and the usage it closes with is what the next gate call reads.
    usage = PoolUsage(borrowed=borrowed, dedicated_busy_share=0.4, borrowed_busy_share=0.1 if borrowed else None)
    kept, _ = learning.close(EMPTY, now=start + length, borrowed=borrowed, number=7, usage=usage,
                             teaches_toggle_cost=False)
    assert kept.gate == learning.gate and kept.history == closed.history and kept.modes == closed.modes
    assert kept.usage == usage and kept.describe()["gate"]["pool_usage"] == usage.to_dict()


def test_history_is_bounded_and_mid_step_context_counts_elapsed_time():
    learning, _ = fresh(time_scale=2.0).close(EMPTY, now=0.0, borrowed=False, number=None)
    for i in range(HISTORY + 5):
        learning = learning.predicted(P, Topology.coloc(4), learning.context())
        learning, _ = learning.close(EMPTY, now=float(i + 1), borrowed=False, number=i)
    assert len(learning.history) == HISTORY and learning.history[-1]["step"] == HISTORY + 4
    assert len(learning.describe()["step_predictions"]) == 10
    ctx = learning.context(now=learning.started_at + 3.0, turns_done=(5, 1), profile=P)
    assert ctx.elapsed_s == pytest.approx(6.0) and len(ctx.remaining) == P.B



def test_an_unborrowed_step_is_kept_for_the_gates_replay_and_a_borrowed_one_is_not():
    from pearl_sglang.core.telemetry import TurnRecord

    turns = tuple(TurnRecord(f"t{i}", k, 10, 5, 5, env_time_s=2.0 if k else 0.0, decode_time_s=0.5, request_s=1.0)
                  for i in range(3) for k in range(4))
    step = StepTelemetry(turns=turns, span_s=12.0)
    kept, _ = fresh(time_scale=20.0).close(step.scaled(20.0), now=1.0, borrowed=False, number=0, dedicated_workers=2)
    assert kept.timeline.workers == 2 and kept.timeline.span_s == pytest.approx(240.0)
    assert kept.timeline.trajectories == (((0.0, 20.0),) + ((40.0, 20.0),) * 3,) * 3  # profile seconds, in order
    borrowed, _ = kept.close(step, now=2.0, borrowed=True, number=1, dedicated_workers=2)
    assert borrowed.timeline is None
