"""The makespan model the control plane decides with: properties of the tail-aware
candidates, gate and step predictions against the paper's."""
import pytest
from hypothesis import assume, given, settings, strategies as st

from pearl_sglang.core.decision import decide, enumerate_candidates
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import gate_for_profile, tail_gate
from pearl_sglang.core.step_model import (
    MakespanModel, StepContext, candidates, gate, running_turns, step_predictions,
)
from pearl_sglang.core.tail import TurnSpread, predict
from tests.core.test_tail import P, profiles, remainings, spreads

budgets = st.integers(1, 10)
contexts = st.builds(StepContext, remaining=st.one_of(st.none(), remainings), spread=st.one_of(st.none(), spreads),
                     elapsed_s=st.floats(0, 1000))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=80), st.integers(1, 64), st.integers(1, 50))
def test_running_turns_counts_the_whole_batch(done, batch, s):
    left = running_turns(done, batch, s)
    assert len(left) == batch
    assert all(k >= 1 for k in left)
    seen = min(len(done), batch)
    assert all(k == s for k in left[seen:])  # not seen yet: every turn ahead
    assert all(k == max(1, s - d) for k, d in zip(left, done[:seen]))


@settings(max_examples=150, deadline=None)
@given(profiles, budgets, contexts)
def test_tail_candidates_keep_the_feasible_set_and_never_predict_below_the_floor(p, n, ctx):
    assert candidates(MakespanModel.PAPER, p, n, ctx) == enumerate_candidates(p, n)
    paper = enumerate_candidates(p, n)
    tail = candidates(MakespanModel.TAIL, p, n, ctx)
    assert [c.topology for c in tail] == [c.topology for c in paper]
    assert [c.violations for c in tail] == [c.violations for c in paper]
    for c in tail:
        pred = predict(p, c.topology, remaining=ctx.remaining, spread=ctx.spread)
        assert c.predicted_makespan_s == pred.makespan_s >= pred.floor_s
    if ctx.remaining is None and ctx.spread is None:  # a fresh batch, no spread: the paper's numbers
        for a, b in zip(tail, paper):
            assert a.predicted_makespan_s == pytest.approx(b.predicted_makespan_s)


@settings(max_examples=150, deadline=None)
@given(profiles, budgets, contexts)
def test_decisions_on_tail_candidates_are_feasible_and_stable(p, n, ctx):
    cands = candidates(MakespanModel.TAIL, p, n, ctx)
    first = decide(p, budget=n, candidates=cands)
    assert first.candidate(first.choice).feasible
    again = decide(p, budget=n, current=first.choice, candidates=cands)
    assert not again.switch and again.choice == first.choice


@settings(max_examples=150, deadline=None)
@given(profiles, st.integers(1, 6), st.integers(1, 6), contexts, st.floats(0, 100))
def test_tail_gate_saving_is_never_negative_and_borrows_only_above_the_cost(p, ded, over, ctx, cost):
    r = p.B if ctx.remaining is None else float(min(len(ctx.remaining), p.B))
    g = gate(MakespanModel.TAIL, p, dedicated_workers=ded, overlap_workers=over, remaining=r, ctx=ctx,
             toggle_cost_s=cost)
    assert g.benefit_s >= -1e-9 * max(1.0, g.t_ded_s)
    assert g.borrow == (g.benefit_s > cost)
    # A higher cost never turns a refusal into a borrow.
    higher = gate(MakespanModel.TAIL, p, dedicated_workers=ded, overlap_workers=over, remaining=r, ctx=ctx,
                  toggle_cost_s=cost + 1.0)
    assert not higher.borrow or g.borrow


@settings(max_examples=100, deadline=None)
@given(profiles, st.integers(1, 6), st.integers(1, 6), st.floats(0, 100))
def test_paper_gate_is_equation_7_unchanged(p, ded, over, cost):
    ours = gate(MakespanModel.PAPER, p, dedicated_workers=ded, overlap_workers=over, remaining=p.B,
                ctx=StepContext(spread=TurnSpread(1.0, 50.0)), toggle_cost_s=cost)
    assert ours == gate_for_profile(p, dedicated_workers=ded, overlap_workers=over, remaining=p.B,
                                    toggle_cost_s=cost)


def test_a_heavy_tail_swallows_the_saving_the_paper_model_sees():
    ctx = StepContext(spread=TurnSpread(env_mean_s=2.0, env_std_s=60.0, tokens_mean=P.r))
    paper = gate(MakespanModel.PAPER, P, dedicated_workers=1, overlap_workers=4, remaining=P.B, ctx=ctx,
                 toggle_cost_s=2.0)
    tail = gate(MakespanModel.TAIL, P, dedicated_workers=1, overlap_workers=4, remaining=P.B, ctx=ctx,
                toggle_cost_s=2.0)
    assert paper.borrow and paper.benefit_s > 3.5  # 34.8 s -> 31.0 s
    assert not tail.borrow and tail.benefit_s < 2.0  # 406.5 s -> 404.9 s: the slowest trajectory's


@settings(max_examples=150, deadline=None)
@given(profiles, budgets, contexts)
def test_step_predictions_add_elapsed_time_to_the_tail_prediction_only(p, n, ctx):
    topo = enumerate_candidates(p, n)[0].topology
    preds = step_predictions(p, topo, ctx)
    rest = predict(p, topo, remaining=ctx.remaining, spread=ctx.spread).makespan_s
    assert preds["tail"] == pytest.approx(ctx.elapsed_s + rest)
    assert preds["paper"] == pytest.approx(enumerate_candidates(p, n)[0].predicted_makespan_s)


def test_model_names_are_validated():
    assert MakespanModel.parse("tail") is MakespanModel.TAIL
    with pytest.raises(InvalidConfig, match="makespan_model"):
        MakespanModel.parse("median")


@settings(max_examples=150, deadline=None)
@given(profiles, st.integers(1, 6), st.integers(1, 6), remainings, spreads)
def test_tail_gate_keeps_the_floor_only_of_a_tail_bound_pool(p, ded, over, left, spread):
    g = tail_gate(p, dedicated_workers=ded, overlap_workers=over, remaining=left, spread=spread, toggle_cost_s=0.0)
    best_ded = min((predict(p, c.topology, remaining=left, spread=spread)
                    for c in enumerate_candidates(p, ded) if c.feasible), key=lambda pr: pr.makespan_s)
    full = [predict(p, c.topology, remaining=left, spread=spread)
            for c in enumerate_candidates(p, ded + over) if c.feasible]
    if best_ded.tail_bound:  # the slowest trajectory's workers have room: borrowing cannot shorten it
        assert g.t_full_s == pytest.approx(min(max(pr.throughput_s, best_ded.floor_s) for pr in full))
        assert g.t_full_s >= best_ded.floor_s * (1 - 1e-9)
    else:  # busy workers: the full pool's own prediction, floor included
        assert g.t_full_s == pytest.approx(min(pr.makespan_s for pr in full))
