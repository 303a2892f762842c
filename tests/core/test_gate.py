"""Borrowing gate, equation (7), and the online toggle-cost estimate."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl_sglang.core.decision import best_makespan
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import ToggleCostEstimator, borrow_gate, gate_for_profile
from pearl_sglang.core.profile import Profile

from tests.support.core_strategies import profiles


def test_equation_7_hand_computed():
    # (32/64) * (300 - 240) = 30 s of saving
    g = borrow_gate(remaining=32, batch=64, t_ded_s=300, t_full_s=240, toggle_cost_s=29.9)
    assert g.borrow and g.benefit_s == pytest.approx(30.0)
    assert not borrow_gate(remaining=32, batch=64, t_ded_s=300, t_full_s=240, toggle_cost_s=30.0).borrow
    assert not borrow_gate(remaining=0, batch=64, t_ded_s=300, t_full_s=240, toggle_cost_s=0.0).borrow


def test_gate_rejects_bad_inputs():
    with pytest.raises(InvalidConfig):
        borrow_gate(remaining=65, batch=64, t_ded_s=1, t_full_s=0, toggle_cost_s=0)
    with pytest.raises(InvalidConfig):
        borrow_gate(remaining=1, batch=64, t_ded_s=1, t_full_s=0, toggle_cost_s=-1)


def test_gate_for_profile_uses_best_makespans():
    p = Profile(B=64, S=20, delta_L=1000, r=500, theta=0.5, A=0.005, b=0.0004, t_prefill=2e-5,
                K=1e5, BW=1e11, T_over=2.0, T_env=50, K_seq=1e9, H_max=1e11)
    g = gate_for_profile(p, dedicated_workers=2, overlap_workers=8, remaining=64, toggle_cost_s=10)
    assert g.t_ded_s == pytest.approx(best_makespan(p, 2)) and g.t_full_s == pytest.approx(best_makespan(p, 10))
    assert g.borrow == (g.t_ded_s - g.t_full_s > 10)
    # With no dedicated workers, any feasible borrowing beats standing still.
    assert gate_for_profile(p, dedicated_workers=0, overlap_workers=2, remaining=1, toggle_cost_s=1e9).borrow


def test_toggle_estimator_uses_initial_until_both_kinds_seen():
    e = ToggleCostEstimator(initial_s=9.0, alpha=0.5)
    e = e.observe(borrowed=True, observed_s=110, predicted_s=100)
    assert e.estimate_s == 9.0
    e = e.observe(borrowed=False, observed_s=102, predicted_s=100)
    assert e.estimate_s == pytest.approx(8.0)  # residual 10 with, 2 without
    e = e.observe(borrowed=True, observed_s=106, predicted_s=100)  # EMA: 0.5*6 + 0.5*10 = 8
    assert e.estimate_s == pytest.approx(6.0)
    with pytest.raises(InvalidConfig):
        ToggleCostEstimator(initial_s=1.0, alpha=0)


@settings(deadline=None, max_examples=40)
@given(st.floats(0, 20), st.floats(-5, 5), st.lists(st.floats(-0.5, 0.5), min_size=30, max_size=30))
def test_toggle_estimator_converges_to_true_cost(cost, bias, noise):
    # Model error ``bias`` is present on every step; borrowing adds ``cost`` on top.
    e = ToggleCostEstimator(initial_s=100.0, alpha=0.3)
    for i, n in enumerate(noise):
        borrowed = i % 2 == 0
        e = e.observe(borrowed=borrowed, observed_s=200 + bias + n + (cost if borrowed else 0), predicted_s=200)
    assert e.estimate_s == pytest.approx(max(0.0, cost), abs=0.8)


@settings(deadline=None, max_examples=60)
@given(profiles(), st.integers(1, 8), st.integers(1, 8))
def test_more_workers_never_predicted_slower(profile, ded, extra):
    # The gate relies on T_full <= T_ded; colocation alone already guarantees it.
    assert best_makespan(profile, ded + extra) <= best_makespan(profile, ded) + 1e-9 * best_makespan(profile, ded)
    assert math.isinf(best_makespan(profile, 0))
