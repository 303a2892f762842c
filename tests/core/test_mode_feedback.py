"""Per-mode correction of the makespan model: the PD prior until both modes ran (neutral
with ``pd_prior: 1``), then the decision compares what each mode delivered; never
changes a ratio decision."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl_sglang.core.decision import Reason, Thresholds, decide, enumerate_candidates
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.mode_feedback import ModeCorrection, ModeFeedback
from pearl_sglang.core.topology import Mode, Topology

from tests.core.test_decision import BASE, P
from tests.support.core_strategies import profiles

ratios = st.floats(min_value=0.3, max_value=3.0)
budgets = st.integers(min_value=2, max_value=12)


def observed(correction: ModeCorrection, mode: Mode, ratios_seen) -> ModeCorrection:
    for r in ratios_seen:
        correction = correction.observe(mode, observed_s=100.0 * r, predicted_s=100.0)
    return correction


@settings(max_examples=150, deadline=None)
@given(profiles(), budgets, st.sampled_from(list(Mode)), st.lists(ratios, min_size=1, max_size=5),
       st.sampled_from(["coloc", "pd"]))
def test_one_mode_seen_changes_no_decision_under_a_neutral_prior(p, n, mode, seen, shape):
    """The unseen mode gets the overall factor, equal to the seen mode's: every
    candidate is scaled alike, so the choice (and its reason) is the paper's."""
    correction = observed(ModeCorrection(ModeFeedback(pd_prior=1.0)), mode, seen)
    current = Topology.coloc(n) if shape == "coloc" else Topology.pd(1, n - 1)
    raw = decide(p, budget=n, current=current)
    fixed = decide(p, budget=n, current=current, candidates=correction.apply(enumerate_candidates(p, n)))
    assert (fixed.choice, fixed.reason_code) == (raw.choice, raw.reason_code)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([None, *Mode]), st.lists(ratios, max_size=5), st.floats(min_value=0.5, max_value=2.0))
def test_until_both_modes_ran_pd_stands_the_prior_above_colocation(mode, seen, prior):
    correction = observed(ModeCorrection(ModeFeedback(pd_prior=prior)), mode, seen) if mode else \
        ModeCorrection(ModeFeedback(pd_prior=prior))
    ratio = correction.factor(Mode.DISAGGREGATED) / correction.factor(Mode.COLOCATED)
    assert ratio == pytest.approx(prior)
    if seen and mode is not None:  # the mode that ran keeps its own factor
        assert correction.factor(mode) == correction.by_mode[mode]


@settings(max_examples=150, deadline=None)
@given(profiles(), budgets, st.sampled_from(["coloc", "pd"]), st.floats(min_value=1.0, max_value=1.5))
def test_the_prior_never_makes_pd_easier_to_enter_or_harder_to_leave(p, n, shape, prior):
    """Against the neutral start, a prior >= 1 never turns a colocated hold into a switch
    to PD, and never turns a switch from PD to colocation into a hold."""
    current = Topology.coloc(n) if shape == "coloc" else Topology.pd(1, n - 1)
    cands = enumerate_candidates(p, n)
    neutral = decide(p, budget=n, current=current)
    biased = decide(p, budget=n, current=current, candidates=ModeCorrection(ModeFeedback(pd_prior=prior)).apply(cands))
    if shape == "coloc" and neutral.choice.mode is Mode.COLOCATED:
        assert biased.choice.mode is Mode.COLOCATED
    if shape == "pd" and neutral.choice.mode is Mode.COLOCATED:
        assert biased.choice.mode is Mode.COLOCATED


@settings(max_examples=150, deadline=None)
@given(profiles(), budgets, ratios, ratios)
def test_factors_keep_the_order_within_a_mode(p, n, coloc, pd):
    correction = observed(observed(ModeCorrection(), Mode.COLOCATED, [coloc]), Mode.DISAGGREGATED, [pd])
    raw = [c for c in enumerate_candidates(p, n) if c.topology.mode is Mode.DISAGGREGATED]
    scaled = [c for c in correction.apply(raw)]
    assert sorted(range(len(raw)), key=lambda i: raw[i].predicted_makespan_s) == \
        sorted(range(len(raw)), key=lambda i: scaled[i].predicted_makespan_s)
    assert [c.feasible for c in raw] == [c.feasible for c in scaled]
    for a, b in zip(raw, scaled):
        assert b.predicted_makespan_s == pytest.approx(a.predicted_makespan_s * min(max(pd, 0.5), 2.0))


def test_a_knife_edge_switch_is_undone_after_one_slow_step_in_the_new_mode():
    """The replay's case: PD predicted just over the mode threshold better than
    colocation, colocated steps ran at 0.80 of prediction, the PD step at 1.22."""
    n = 6
    cands = enumerate_candidates(P, n)
    coloc = cands[0].predicted_makespan_s
    best_pd = min((c for c in cands[1:] if c.feasible), key=lambda c: c.predicted_makespan_s)
    gain = (coloc - best_pd.predicted_makespan_s) / coloc
    assert gain > 0.15  # the paper's model alone switches
    assert decide(P, budget=n, current=Topology.coloc(n)).reason_code is Reason.SWITCH_MODE
    learned = observed(observed(ModeCorrection(), Mode.COLOCATED, [0.80]), Mode.DISAGGREGATED, [1.22])
    corrected = learned.apply(cands)
    back = decide(P, budget=n, current=best_pd.topology, candidates=corrected)
    assert back.choice == Topology.coloc(n) and back.reason_code is Reason.SWITCH_MODE
    stay = decide(P, budget=n, current=Topology.coloc(n), candidates=corrected)
    assert stay.choice == Topology.coloc(n) and not stay.switch


@pytest.mark.parametrize("n, switches", [(5, False), (6, False), (7, False), (8, True)])
def test_the_prior_holds_knife_edge_switches_and_admits_clear_ones(n, switches):
    """PD predicted 16.5%, 19.1% and 20.8% faster than colocation (the elastic replays'
    excursions were at 15.4% and 15.7%) stays colocated after colocated steps at 0.9 of
    prediction; 22.0% clears the bar the 1.08 prior sets (1 - 0.85 / 1.08 = 21.3%)."""
    cands = enumerate_candidates(P, n)
    assert decide(P, budget=n, current=Topology.coloc(n)).reason_code is Reason.SWITCH_MODE
    seen = observed(ModeCorrection(), Mode.COLOCATED, [0.9])
    d = decide(P, budget=n, current=Topology.coloc(n), candidates=seen.apply(cands))
    assert d.switch is switches and (d.choice.mode is Mode.DISAGGREGATED) is switches


def test_ewma_clip_and_bad_observations():
    c = ModeCorrection(ModeFeedback(alpha=0.5, min_ratio=0.5, max_ratio=2.0))
    assert c.factor(Mode.COLOCATED) == 1.0 and c.factor(Mode.DISAGGREGATED) == pytest.approx(1.08)
    c = c.observe(Mode.COLOCATED, observed_s=80.0, predicted_s=100.0)
    assert c.factor(Mode.COLOCATED) == pytest.approx(0.8) and c.factor(Mode.DISAGGREGATED) == pytest.approx(0.8 * 1.08)
    c = c.observe(Mode.DISAGGREGATED, observed_s=900.0, predicted_s=100.0)  # clipped to 2.0
    assert c.factor(Mode.DISAGGREGATED) == pytest.approx(2.0)
    assert c.overall == pytest.approx(0.5 * 0.8 + 0.5 * 2.0)
    c = c.observe(Mode.DISAGGREGATED, observed_s=100.0, predicted_s=100.0)
    assert c.factor(Mode.DISAGGREGATED) == pytest.approx(1.5)
    for obs, pred, mode in [(0.0, 1.0, Mode.COLOCATED), (1.0, 0.0, Mode.COLOCATED), (math.inf, 1.0, Mode.COLOCATED),
                            (math.nan, 1.0, Mode.COLOCATED), (1.0, 1.0, None)]:
        assert c.observe(mode, observed_s=obs, predicted_s=pred) is c
    assert c.describe()["by_mode"] == {"colocated": {"factor": pytest.approx(0.8), "steps": 1},
                                       "disaggregated": {"factor": pytest.approx(1.5), "steps": 2}}
    off = observed(ModeCorrection(ModeFeedback(enabled=False)), Mode.COLOCATED, [0.5])
    assert off.factor(Mode.COLOCATED) == 1.0 and off.apply(enumerate_candidates(P, 4)) == enumerate_candidates(P, 4)


@pytest.mark.parametrize("kw, key", [({"alpha": 0.0}, "alpha"), ({"alpha": 1.5}, "alpha"),
                                     ({"min_ratio": 1.5}, "min_ratio"), ({"max_ratio": 0.9}, "min_ratio"),
                                     ({"alpha": "x"}, "alpha"), ({"enabled": 1}, "enabled"),
                                     ({"pd_prior": 2.5}, "pd_prior"), ({"pd_prior": 0.2}, "pd_prior"),
                                     ({"pd_prior": float("nan")}, "pd_prior")])
def test_config_is_validated(kw, key):
    with pytest.raises(InvalidConfig) as e:
        ModeFeedback(**kw)
    assert e.value.key == key
