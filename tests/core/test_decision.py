"""Decision engine: hand-checked choices, hysteresis, forced switches, and properties."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl_sglang.core.decision import Reason, Thresholds, decide, enumerate_candidates
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.makespan import Constraints, coloc_makespan, dis_makespan
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.topology import Mode, Topology

from tests.support.core_strategies import profiles, topologies

# Decode-heavy, no bubble, cheap transfer: disaggregation should win and want many D.
BASE = dict(B=64, S=20, delta_L=1000, r=500, theta=0.0, A=0.005, b=0.0004, t_prefill=2e-5,
            K=1e5, BW=1e11, T_over=2.0, T_env=50, K_seq=1e9, H_max=1e11)
P = Profile(**BASE)


def test_candidates_enumerate_colocation_and_every_split():
    cands = enumerate_candidates(P, 5)
    assert [c.topology for c in cands] == [Topology.coloc(5)] + [Topology.pd(p, 5 - p) for p in range(1, 5)]
    assert cands[0].predicted_makespan_s == pytest.approx(coloc_makespan(P, 5))
    assert cands[2].predicted_makespan_s == pytest.approx(dis_makespan(P, 2, 3))


def test_initial_decision_picks_minimum_over_feasible():
    d = decide(P, budget=6)
    feasible = [c for c in d.candidates if c.feasible]
    assert d.switch and not d.forced and d.reason_code is Reason.INITIAL
    assert d.predicted_makespan_s == min(c.predicted_makespan_s for c in feasible)


def test_kv_constraint_excludes_candidates():
    tight = Profile(**{**BASE, "K_seq": 4e9})  # B*K_seq = 256e9 -> N_D >= 3 with H_max 1e11
    d = decide(tight, budget=5)
    for c in d.candidates:
        if c.topology.mode is Mode.DISAGGREGATED:
            assert c.feasible == (c.topology.decode >= 3)
    assert d.choice.decode >= 3 or d.choice.mode is Mode.COLOCATED


def _hold_margin(current: Topology, budget: int) -> float:
    cands = {c.topology: c.predicted_makespan_s for c in enumerate_candidates(P, budget)}
    best = min(cands.values())
    return (cands[current] - best) / cands[current]


def test_ratio_hysteresis_threshold_is_strict():
    d0 = decide(P, budget=6)
    assert d0.choice.mode is Mode.DISAGGREGATED
    # A neighbour ratio of the best, and its relative gap to the best.
    neighbour = Topology.pd(d0.choice.prefill + 1, d0.choice.decode - 1)
    gap = _hold_margin(neighbour, 6)
    assert gap > 0
    hold = decide(P, budget=6, current=neighbour, thresholds=Thresholds(ratio=gap + 1e-9, mode=0.9))
    assert not hold.switch and hold.choice == neighbour and hold.reason_code is Reason.HOLD
    go = decide(P, budget=6, current=neighbour, thresholds=Thresholds(ratio=gap - 1e-9, mode=0.9))
    assert go.switch and go.choice == d0.choice and go.reason_code is Reason.SWITCH_RATIO


def test_mode_switch_needs_the_larger_threshold():
    d0 = decide(P, budget=6)
    gap = _hold_margin(Topology.coloc(6), 6)
    assert gap > 0.01
    ratio_only = Thresholds(ratio=0.0, mode=gap + 1e-6)
    d = decide(P, budget=6, current=Topology.coloc(6), thresholds=ratio_only)
    assert not d.switch and d.choice == Topology.coloc(6) and str(round(gap * 100, 2)) in d.reason
    d = decide(P, budget=6, current=Topology.coloc(6), thresholds=Thresholds(ratio=0.0, mode=gap - 1e-6))
    assert d.switch and d.choice == d0.choice and d.reason_code is Reason.SWITCH_MODE


def test_ratio_change_allowed_when_mode_switch_is_not():
    # Current PD shape is poor; colocation is best but only by a margin below the mode
    # threshold; the best PD ratio beats the current one by more than the ratio threshold.
    prof = Profile(**{**BASE, "theta": 3.0, "T_over": 0.0})
    cands = {c.topology: c.predicted_makespan_s for c in enumerate_candidates(prof, 6)}
    pd_best = min((t for t in cands if t.mode is Mode.DISAGGREGATED), key=cands.get)
    assert cands[Topology.coloc(6)] < cands[pd_best]
    current = Topology.pd(5, 1)
    d = decide(prof, budget=6, current=current, thresholds=Thresholds(ratio=0.01, mode=0.99))
    assert d.switch and d.choice == pd_best and d.reason_code is Reason.SWITCH_RATIO


def test_forced_when_last_prefill_left():
    d = decide(P, budget=4, current=Topology.pd(0, 4), thresholds=Thresholds(ratio=0.99, mode=0.99))
    assert d.forced and d.switch and d.choice.is_valid and d.choice.total == 4
    assert "0P4D" in d.reason


def test_forced_when_current_violates_kv():
    tight = Profile(**{**BASE, "K_seq": 4e9})
    d = decide(tight, budget=5, current=Topology.pd(3, 2), thresholds=Thresholds(ratio=0.99, mode=0.99))
    assert d.forced and "kv" in d.reason and d.choice != Topology.pd(3, 2)


def test_budget_change_resizes_without_counting_as_switch():
    d = decide(P, budget=6)
    grown = decide(P, budget=7, current=d.choice, thresholds=Thresholds(ratio=0.99, mode=0.99))
    assert not grown.switch and not grown.forced and grown.choice.total == 7
    assert grown.choice.mode is d.choice.mode
    assert abs(grown.choice.prefill - d.choice.prefill) + abs(grown.choice.decode - d.choice.decode) == 1
    assert "resize" in grown.reason


def test_budget_must_be_positive_and_thresholds_ordered():
    with pytest.raises(InvalidConfig):
        decide(P, budget=0)
    with pytest.raises(InvalidConfig):
        Thresholds(ratio=0.2, mode=0.1)
    with pytest.raises(InvalidConfig):
        Thresholds(ratio=-0.1)


def test_decision_to_dict_has_cli_keys():
    d = decide(P, budget=3).to_dict()
    assert set(d) >= {"choice", "switch", "forced", "reason", "candidates"}
    assert set(d["choice"]) == {"mode", "prefill", "decode", "colocated"}
    assert set(d["candidates"][0]) >= {"mode", "prefill", "decode", "colocated", "feasible", "predicted_makespan_s"}


thresholds = st.builds(lambda a, b: Thresholds(ratio=min(a, b), mode=max(a, b)),
                       st.floats(0, 0.5), st.floats(0, 0.5))


@settings(deadline=None, max_examples=150)
@given(profiles(), st.integers(1, 16), topologies(18), thresholds)
def test_never_picks_infeasible(profile, budget, current, th):
    d = decide(profile, budget=budget, current=current, thresholds=th)
    chosen = d.candidate(d.choice)
    assert chosen.feasible and d.choice.is_valid and d.choice.total == budget


@settings(deadline=None, max_examples=150)
@given(profiles(), st.integers(1, 16), st.none() | topologies(18), thresholds, st.floats(0.2, 1.5))
def test_no_oscillation_under_constant_profile(profile, budget, current, th, rho_max):
    cons = Constraints(rho_max=rho_max)
    d = decide(profile, budget=budget, current=current, thresholds=th, constraints=cons)
    for _ in range(3):
        nxt = decide(profile, budget=budget, current=d.choice, thresholds=th, constraints=cons)
        assert not nxt.switch and not nxt.forced and nxt.choice == d.choice
        d = nxt


@settings(deadline=None, max_examples=150)
@given(profiles(), st.integers(1, 16), topologies(18), thresholds)
def test_forced_switches_yield_feasible_topology(profile, budget, current, th):
    d = decide(profile, budget=budget, current=current, thresholds=th)
    if not current.is_valid:
        assert d.forced
    if d.forced:
        assert d.switch and d.candidate(d.choice).feasible and d.choice.total == budget
        assert d.predicted_makespan_s == min(c.predicted_makespan_s for c in d.candidates if c.feasible)
