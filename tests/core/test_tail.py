"""Tail-aware makespan: properties against the paper's model and hand-checked cases."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.makespan import evaluate
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.tail import (
    TurnSpread, latency_floor, predict, remaining_profile, remaining_turns, spread_of,
)
from pearl_sglang.core.telemetry import StepTelemetry, TurnRecord
from pearl_sglang.core.topology import Topology

P = Profile(B=8, S=10, delta_L=100, r=50, theta=1.0, A=0.01, b=0.001, t_prefill=1e-4,
            K=1000, BW=1e6, T_over=0.5, T_env=20, K_seq=1e9, H_max=3e9)

profiles = st.builds(
    Profile, B=st.integers(1, 128).map(float), S=st.integers(1, 30).map(float),
    delta_L=st.floats(0, 2000), r=st.floats(0, 1000), theta=st.floats(0, 10), A=st.floats(0, 0.1),
    b=st.floats(0, 0.01), t_prefill=st.floats(0, 1e-3), K=st.floats(0, 1e5), BW=st.floats(1e6, 1e11),
    T_over=st.floats(0, 1), T_env=st.floats(0, 500), K_seq=st.just(1.0), H_max=st.just(1e12))
topologies = st.one_of(st.integers(1, 8).map(Topology.coloc),
                       st.tuples(st.integers(1, 4), st.integers(1, 4)).map(lambda t: Topology.pd(*t)))
spreads = st.builds(TurnSpread, env_mean_s=st.floats(0, 60), env_std_s=st.floats(0, 60),
                    tokens_mean=st.floats(0, 2000), tokens_std=st.floats(0, 2000), z=st.floats(0, 4))
remainings = st.lists(st.integers(0, 40).map(float), min_size=1, max_size=40).map(tuple)


@settings(max_examples=200, deadline=None)
@given(profiles, topologies)
def test_fresh_batch_without_spread_equals_the_paper_model(p, topo):
    today = evaluate(p, topo).predicted_makespan_s
    pred = predict(p, topo)
    assert pred.floor_s <= today * (1 + 1e-9) + 1e-9
    assert pred.makespan_s == pytest.approx(today)


@settings(max_examples=200, deadline=None)
@given(profiles, topologies, remainings, spreads)
def test_never_below_the_paper_model_on_the_remaining_work(p, topo, rem, spread):
    pred = predict(p, topo, remaining=rem, spread=spread)
    left = remaining_profile(p, rem)
    today = 0.0 if left is None else evaluate(left, topo).predicted_makespan_s
    assert pred.makespan_s >= today
    assert pred.makespan_s == max(today, pred.floor_s)
    if pred.floor_s <= today:
        assert pred.makespan_s == today


@settings(max_examples=200, deadline=None)
@given(profiles, topologies, remainings, spreads, st.integers(0, 10), st.data())
def test_monotonic_in_remaining_work(p, topo, rem, spread, extra, data):
    i = data.draw(st.integers(0, len(rem) - 1))
    more = rem[:i] + (rem[i] + extra,) + rem[i + 1:]
    assert predict(p, topo, remaining=more, spread=spread).makespan_s >= \
        predict(p, topo, remaining=rem, spread=spread).makespan_s * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(profiles, topologies, remainings, spreads, st.floats(0, 30))
def test_floor_grows_with_spread(p, topo, rem, spread, more_std):
    wider = TurnSpread(spread.env_mean_s, spread.env_std_s + more_std, spread.tokens_mean, spread.tokens_std, spread.z)
    assert latency_floor(p, topo, rem, wider) >= latency_floor(p, topo, rem, spread)


def test_environment_bound_tail_dominates_and_extra_workers_do_not_help():
    # One straggler with 10 turns left, 30 s +- 10 s environment per turn.
    spread = TurnSpread(env_mean_s=30, env_std_s=10, tokens_mean=50, z=2)
    rem = (10.0, 1.0, 1.0)
    small = predict(P, Topology.coloc(2), remaining=rem, spread=spread)
    big = predict(P, Topology.coloc(8), remaining=rem, spread=spread)
    assert small.tail_bound and big.tail_bound
    # iteration = 0.01 + 0.001 * 3/(N*2); turn mean = 30 + 50*iteration
    it8 = 0.01 + 0.001 * 3 / 16
    assert big.floor_s == pytest.approx(10 * (30 + 50 * it8) + 2 * math.sqrt(10) * 10)
    assert small.makespan_s - big.makespan_s < 0.01 * big.makespan_s


def test_nothing_running_is_zero_and_remaining_turns_floor_at_one():
    assert predict(P, Topology.coloc(2), remaining=()).makespan_s == 0.0
    assert remaining_turns([0, 4, 12], 10) == (10.0, 6.0, 1.0)
    with pytest.raises(InvalidConfig):
        TurnSpread(env_mean_s=-1)


def test_spread_of_telemetry():
    turns = tuple(TurnRecord("t", i, 10, 0, g, env, 0.1) for i, (g, env) in enumerate([(40, 1.0), (60, 3.0)]))
    s = spread_of(StepTelemetry(turns))
    assert (s.env_mean_s, s.env_std_s, s.tokens_mean, s.tokens_std) == (2.0, 1.0, 50.0, 10.0)
    assert spread_of(StepTelemetry(())) is None
