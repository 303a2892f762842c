"""Critical-path estimate: properties of the pure core."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from pearl_sglang.core.critical_path import (TrajectoryProgress, WorkloadHistory, estimate,
                                             predicted_stragglers)
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.telemetry import StepTelemetry, TurnRecord

progress_st = st.builds(TrajectoryProgress, trajectory_id=st.text(min_size=1, max_size=6),
                        turns_done=st.integers(0, 50), tokens_so_far=st.integers(0, 100_000),
                        elapsed_s=st.floats(0, 1e5, allow_nan=False),
                        expected_turns=st.none() | st.integers(1, 60))
history_st = st.builds(WorkloadHistory, turn_counts=st.lists(st.integers(1, 60), max_size=30).map(tuple),
                       mean_turn_s=st.none() | st.floats(0, 1e3, allow_nan=False))


@given(progress_st, history_st)
def test_estimates_are_finite_non_negative_and_at_least_one_turn(p, h):
    e = estimate(p, h)
    for v in (e.remaining_turns, e.remaining_tokens, e.remaining_s):
        assert math.isfinite(v) and v >= 0
    assert e.remaining_turns >= 1


@given(st.integers(1, 60), st.integers(0, 59), st.integers(1, 20), st.floats(0, 1e4, allow_nan=False))
def test_uniform_history_leaves_exactly_the_missing_turns(n, k, copies, elapsed):
    if k >= n:
        k = n - 1
    e = estimate(TrajectoryProgress("t", k, 10 * k, elapsed), WorkloadHistory((n,) * copies, None))
    assert e.remaining_turns == n - k
    if k > 0:
        assert e.remaining_s == pytest.approx((n - k) * elapsed / k)
        assert e.remaining_tokens == pytest.approx((n - k) * 10)


@given(st.integers(1, 60), st.integers(0, 60), history_st, st.floats(0, 1e4, allow_nan=False))
def test_an_expected_turn_count_replaces_the_distribution_until_it_is_reached(expected, k, h, elapsed):
    hinted = estimate(TrajectoryProgress("t", k, 10 * k, elapsed, expected_turns=expected), h)
    plain = estimate(TrajectoryProgress("t", k, 10 * k, elapsed), h)
    if k < expected:
        assert hinted.remaining_turns == expected - k
        assert hinted.remaining_s == pytest.approx(plain.remaining_s / plain.remaining_turns * (expected - k))
    else:  # the hint was too low: the workload's distribution answers again
        assert replace(hinted, expected_turns=None) == plain
    assert hinted.expected_turns == expected and hinted.to_dict()["expected_turns"] == expected


@given(st.lists(progress_st, max_size=40, unique_by=lambda p: p.trajectory_id), history_st,
       st.floats(0.01, 1.0))
def test_stragglers_are_the_top_share_latest_first(ps, h, share):
    named = predicted_stragglers(ps, h, share=share)
    assert len(named) == math.ceil(share * len(ps))
    assert [e.remaining_s for e in named] == sorted((e.remaining_s for e in named), reverse=True)
    ids = {e.trajectory_id for e in named}
    left = [estimate(p, h) for p in ps if p.trajectory_id not in ids]
    if named and left:
        assert max(e.remaining_s for e in left) <= named[-1].remaining_s
    assert predicted_stragglers(list(reversed(ps)), h, share=share) == named


def test_a_trajectory_behind_on_turns_and_slow_is_the_straggler():
    h = WorkloadHistory((4, 4, 8), mean_turn_s=1.0)
    ps = [TrajectoryProgress("fast", 3, 300, 3.0), TrajectoryProgress("slow", 1, 100, 4.0),
          TrajectoryProgress("mid", 2, 200, 2.0)]
    assert [e.trajectory_id for e in predicted_stragglers(ps, h, share=0.3)] == ["slow"]
    # E[N - 1 | N > 1] = 16/3 - 1; per turn (4 + 1) / 2
    assert estimate(ps[1], h).remaining_s == pytest.approx((16 / 3 - 1) * 2.5)


def test_history_from_a_step_counts_turns_per_trajectory():
    rec = lambda tid, i: TurnRecord(tid, i, 10, 5, 5, env_time_s=1.0, decode_time_s=2.0)  # noqa: E731
    h = WorkloadHistory.from_step(StepTelemetry(turns=(rec("a", 0), rec("a", 1), rec("b", 0))))
    assert h.turn_counts == (1, 2) and h.mean_turn_s == 3.0
    assert WorkloadHistory.from_step(StepTelemetry(turns=())) == WorkloadHistory()


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_bad_share_is_rejected(share):
    with pytest.raises(InvalidConfig):
        predicted_stragglers([], WorkloadHistory(), share=share)
