"""The gate's replay of the last unborrowed step with the overlap workers (core.borrow_replay)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pearl_sglang.core.borrow_replay import ReplaySaving, StepTimeline, replay_guard, replay_saving, speedup
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import borrow_gate
from pearl_sglang.core.telemetry import StepTelemetry, TurnRecord

BORROW = borrow_gate(remaining=64, batch=64, t_ded_s=335.0, t_full_s=225.8, toggle_cost_s=10.47)
A, B = 0.0028, 0.00165  # Qwen3-30B-A3B's fitted decode rates at the grid's cache-friendly point

turn = st.tuples(st.floats(0, 50), st.floats(0, 20))
trajectories = st.lists(st.lists(turn, min_size=1, max_size=8).map(tuple), min_size=1, max_size=8).map(tuple)


def _timeline(trajs, workers=4) -> StepTimeline:
    end = max(sum(e + r for e, r in t) for t in trajs)
    return StepTimeline(trajs, span_s=max(end, 1.0), workers=workers)


def _record(tid: str, k: int, env: float, request: float) -> TurnRecord:
    return TurnRecord(trajectory_id=tid, turn_index=k, new_input_tokens=10, carried_tokens=5, generated_tokens=5,
                      env_time_s=env, decode_time_s=request / 2, request_s=request)


def test_the_step_that_waits_on_its_environment_saves_little():
    # The slowest trajectory spends most of its time in its environment; the workers come
    # after the first half: only its last requests get faster.
    slow = ((0.0, 4.0),) + ((6.0, 4.0),) * 29          # 30 turns: 174 s environment, 120 s requests
    fast = ((0.0, 10.0),) + ((1.0, 10.0),) * 14        # request-bound, but done at 164 s
    tl = StepTimeline((slow, fast) * 4, span_s=294.0, workers=8)
    s = replay_saving(tl, join_after_s=162.0, A=A, b=B, overlap_workers=8)
    assert 0 < s.saved_s < BORROW.toggle_cost_s and 0.5 < s.speedup < 1
    refused = replay_guard(BORROW, s)
    assert not refused.borrow and "replayed" in refused.reason and refused.overruled
    # Had the workers served from the start, the same step would have paid.
    early = replay_saving(tl, join_after_s=0.0, A=A, b=B, overlap_workers=8)
    assert early.saved_s > BORROW.toggle_cost_s and replay_guard(BORROW, early) is BORROW


def test_timeline_of_telemetry_orders_turns_and_needs_request_times():
    step = StepTelemetry(turns=(_record("a", 1, 3.0, 2.0), _record("b", 0, 0.0, 5.0), _record("a", 0, 0.0, 1.0)),
                         span_s=10.0)
    tl = StepTimeline.of(step, workers=2)
    assert sorted(tl.trajectories) == [((0.0, 1.0), (3.0, 2.0)), ((0.0, 5.0),)]
    assert tl.concurrency == pytest.approx(8.0 / (10.0 * 2))
    unmeasured = StepTelemetry(turns=(TurnRecord("a", 0, 1, 1, 1, 0.0, 1.0),), span_s=10.0)
    assert StepTimeline.of(unmeasured, workers=2) is None
    assert StepTimeline.of(step, workers=0) is None and StepTimeline.of(StepTelemetry(turns=step.turns), workers=2) \
        is None


@given(trajectories, st.floats(0, 400), st.integers(1, 8), st.integers(0, 16))
def test_saving_is_bounded_by_one_trajectorys_requests(trajs, join, workers, overlap):
    tl = _timeline(trajs, workers)
    s = replay_saving(tl, join_after_s=join, A=A, b=B, overlap_workers=overlap)
    assert 0 < s.speedup <= 1
    assert -1e-9 <= s.saved_s <= (1 - s.speedup) * max(sum(r for _, r in t) for t in trajs) + 1e-9


@given(trajectories, st.floats(0, 400), st.floats(0, 400), st.integers(1, 16))
def test_later_workers_never_save_more(trajs, a, b, overlap):
    tl = _timeline(trajs)
    early, late = sorted((a, b))
    assert replay_saving(tl, join_after_s=late, A=A, b=B, overlap_workers=overlap).saved_s <= \
        replay_saving(tl, join_after_s=early, A=A, b=B, overlap_workers=overlap).saved_s + 1e-9


@given(trajectories)
def test_no_workers_or_workers_after_the_end_save_nothing(trajs):
    tl = _timeline(trajs)
    assert replay_saving(tl, join_after_s=0.0, A=A, b=B, overlap_workers=0).saved_s == 0
    end = max(sum(e + r for e, r in t) for t in trajs)
    assert replay_saving(tl, join_after_s=end + 1, A=A, b=B, overlap_workers=8).saved_s == 0


@given(st.floats(0, 64), st.integers(1, 16), st.integers(0, 16), st.integers(0, 16))
def test_more_overlap_workers_speed_a_request_up_more(n, dedicated, o1, o2):
    fewer, more = sorted((o1, o2))
    f = speedup(A=A, b=B, concurrency=n, dedicated=dedicated, overlap=more)
    assert 0 < f <= speedup(A=A, b=B, concurrency=n, dedicated=dedicated, overlap=fewer) <= 1


def test_guard_keeps_every_other_decision():
    small = ReplaySaving(saved_s=1.0, join_after_s=100.0, speedup=0.9, concurrency=2.0)
    refuse = borrow_gate(remaining=64, batch=64, t_ded_s=300, t_full_s=299, toggle_cost_s=9.4)
    assert replay_guard(refuse, small) is refuse and replay_guard(BORROW, None) is BORROW
    assert replay_guard(BORROW, ReplaySaving(50.0, 100.0, 0.6, 4.0)) is BORROW


@pytest.mark.parametrize("kw", [{"span_s": 0.0}, {"workers": 0}])
def test_a_timeline_that_cannot_be_replayed_is_rejected(kw):
    with pytest.raises(InvalidConfig):
        StepTimeline(**{"trajectories": (((0.0, 1.0),),), "span_s": 10.0, "workers": 1, **kw})


def test_negative_times_and_a_bad_join_are_rejected():
    with pytest.raises(InvalidConfig):
        StepTimeline((((0.0, -1.0),),), span_s=10.0, workers=1)
    with pytest.raises(InvalidConfig, match="join_after_s"):
        replay_saving(_timeline((((0.0, 1.0),),)), join_after_s=float("nan"), A=A, b=B, overlap_workers=1)
