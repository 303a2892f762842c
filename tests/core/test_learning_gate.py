"""The learning gate: bounded exploration, and a toggle cost learned from what ran."""
import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import ToggleCostEstimator, borrow_gate, gate_for_profile, tail_gate
from pearl_sglang.core.learning_gate import Exploration, LearningGate
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.tail import TurnSpread, fresh_batch

P = Profile(B=8, S=10, delta_L=100, r=50, theta=1.0, A=0.01, b=0.001, t_prefill=1e-4,
            K=1000, BW=1e6, T_over=0.5, T_env=20, K_seq=1e9, H_max=3e9)


def _gate(benefit: float, cost: float):
    return borrow_gate(remaining=1, batch=1, t_ded_s=100 + benefit, t_full_s=100, toggle_cost_s=cost)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.lists(st.floats(0, 50), min_size=1, max_size=200), st.floats(0, 20))
def test_exploration_is_bounded_by_its_rate(rate, benefits, cost):
    g = LearningGate(ToggleCostEstimator(initial_s=cost), Exploration(rate=rate))
    for i, benefit in enumerate(benefits, 1):
        g, choice = g.choose(_gate(benefit, g.toggle_cost_s))
        assert g.explored <= rate * i + 1e-9
        assert choice.borrow == (choice.gate.borrow != choice.explored)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.floats(0.1, 20), st.floats(2.0001, 100), st.integers(1, 100))
def test_never_explores_when_the_benefit_is_large(rate, cost, factor, steps):
    g = LearningGate(ToggleCostEstimator(initial_s=cost), Exploration(rate=rate, max_benefit_ratio=2.0))
    for _ in range(steps):
        g, choice = g.choose(_gate(cost * factor, cost))
        assert choice.borrow and not choice.explored


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1), st.floats(0.1, 20), st.floats(0, 0.4999), st.integers(1, 100))
def test_never_tries_borrowing_when_the_benefit_is_far_below_the_cost(rate, cost, factor, steps):
    g = LearningGate(ToggleCostEstimator(initial_s=cost), Exploration(rate=rate, max_benefit_ratio=2.0))
    for _ in range(steps):
        g, choice = g.choose(_gate(cost * factor, cost))
        assert not choice.borrow and not choice.explored


def test_a_gate_that_never_borrows_learns_the_cost_by_borrowing_once_in_a_while():
    """Initial guess 10 s, true cost 3 s, benefit 6 s: equation (7) with the guess never
    borrows; exploration measures borrowed steps, learns 3 s, and then borrows."""
    g = LearningGate(ToggleCostEstimator(initial_s=10.0, alpha=0.5), Exploration(rate=0.2))
    borrowed = []
    for _ in range(60):
        g, choice = g.choose(_gate(6.0, g.toggle_cost_s))
        borrowed.append(choice.borrow)
        predicted = 100.0 if choice.borrow else 106.0
        g = g.observe(borrowed=choice.borrow, observed_s=predicted + 5.0 + (3.0 if choice.borrow else 0.0),
                      predicted_s=predicted)
    assert g.learned and g.toggle_cost_s == pytest.approx(3.0)
    assert not borrowed[0] and sum(borrowed[-20:]) >= 15  # unborrowed only to keep measuring


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 30), st.floats(-20, 20), st.floats(0.05, 0.8))
def test_learns_the_cost_from_observations(true_cost, bias, rate):
    """A world where borrowing costs ``true_cost`` beyond the model and the model is off
    by ``bias``; a gate that would always borrow learns the cost through exploration."""
    g = LearningGate(ToggleCostEstimator(initial_s=50.0, alpha=0.5), Exploration(rate=rate, max_benefit_ratio=1e6))
    for _ in range(200):
        g, choice = g.choose(_gate(60.0, g.toggle_cost_s))
        predicted = 100.0 if choice.borrow else 160.0
        observed = predicted + bias + (true_cost if choice.borrow else 0.0)
        g = g.observe(borrowed=choice.borrow, observed_s=observed, predicted_s=predicted)
    assert g.learned and g.seen_without >= 1
    assert g.toggle_cost_s == pytest.approx(max(true_cost, 0.0), abs=1e-6)
    assert g.bias_s == pytest.approx(bias, abs=1e-6)


def test_without_exploration_an_always_borrowing_gate_never_learns():
    g = LearningGate(ToggleCostEstimator(initial_s=5.0), Exploration(rate=0.0))
    for _ in range(50):
        g, choice = g.choose(_gate(60.0, g.toggle_cost_s))
        g = g.observe(borrowed=choice.borrow, observed_s=130.0, predicted_s=100.0)
    assert not g.learned and g.toggle_cost_s == 5.0


def test_exploration_stops_once_learned_unless_kept():
    g = LearningGate(ToggleCostEstimator(initial_s=1.0), Exploration(rate=0.5, min_observations=1,
                                                                     keep_exploring=False))
    explored = []
    for _ in range(20):
        g, choice = g.choose(_gate(1.5, g.toggle_cost_s))
        explored.append(choice.explored)
        g = g.observe(borrowed=choice.borrow, observed_s=10.0, predicted_s=10.0)
    assert sum(explored) == 1


@pytest.mark.parametrize("kw", [{"rate": 1.5}, {"rate": -0.1}, {"max_benefit_ratio": 0.5},
                                {"min_observations": 0}])
def test_exploration_config_validates(kw):
    with pytest.raises(InvalidConfig):
        Exploration(**kw)


def test_tail_gate_refuses_when_the_floor_swallows_the_saving():
    # Fresh batch, no spread: same answer as equation (7) with R = B.
    spread = TurnSpread.of_profile(P)
    paper = gate_for_profile(P, dedicated_workers=1, overlap_workers=3, remaining=P.B, toggle_cost_s=1.0)
    tail = tail_gate(P, dedicated_workers=1, overlap_workers=3, remaining=fresh_batch(P), spread=spread,
                     toggle_cost_s=1.0)
    assert tail.benefit_s == pytest.approx(paper.benefit_s) and tail.borrow == paper.borrow
    # One straggler with heavy environment time: more workers buy (almost) nothing.
    slow = TurnSpread(env_mean_s=30, env_std_s=10, tokens_mean=50)
    tail = tail_gate(P, dedicated_workers=1, overlap_workers=3, remaining=(10.0,), spread=slow, toggle_cost_s=1.0)
    assert not tail.borrow and tail.benefit_s < 1.0


# The borrow gate's inputs at train_finished of the first step in a decision-quality replay
# (swe-paper preset, 4 reserved TP2 workers + 8 overlap workers, batch 32, 81.9 s into the
# next rollout): the fitted profile, the turns left of the 32 running trajectories and the
# last step's spread. Borrowing paid there: the rollout took 407 s with the overlap workers
# against 463 s without.
SWE_BUSY = Profile(B=32, S=30.0, delta_L=14909.0, r=504.16, theta=0.23696, A=0.021435, b=0.00030837,
                   t_prefill=2.2629e-05, K=147456, BW=84e9, T_over=0.2, T_env=71.570, K_seq=4831838208,
                   H_max=119.6e9)
SWE_BUSY_LEFT = (26.0,) + (24.0,) * 5 + (23.0,) * 10 + (22.0,) * 13 + (21.0,) * 3
SWE_BUSY_SPREAD = TurnSpread(env_mean_s=2.3857, env_std_s=7.1195, tokens_mean=504.16, tokens_std=117.92)


def test_tail_gate_borrows_when_the_dedicated_pool_is_busy():
    g = tail_gate(SWE_BUSY, dedicated_workers=4, overlap_workers=8, remaining=SWE_BUSY_LEFT,
                  spread=SWE_BUSY_SPREAD, toggle_cost_s=9.44)
    # The dedicated pool is throughput-bound (451 s of work, floor 447 s): the borrowed
    # workers take turns off it and the slowest trajectory's turns run at the larger
    # pool's batch (floor 429 s). Keeping the dedicated floor predicted a 3.7 s saving.
    assert g.t_ded_s == pytest.approx(450.7, abs=0.5)
    assert g.t_full_s == pytest.approx(429.0, abs=0.5)
    assert g.borrow and g.benefit_s > 2 * 9.44
