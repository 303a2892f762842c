"""The SWE workload sampler: determinism, its statistics against the config, the rewrite
fraction, GRPO groups sharing a prompt, and the core telemetry it feeds."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.telemetry import StepTelemetry, fit_step
from pearl_sglang.workload import SweSampler, SweWorkload, TurnTelemetry, to_turn_records


def test_same_seed_same_workload_other_seed_differs():
    a, b = SweSampler(SweWorkload(seed=3)), SweSampler(SweWorkload(seed=3))
    c = SweSampler(SweWorkload(seed=4))
    for i in (0, 17, 1000):
        assert a.initial_prompt(i) == b.initial_prompt(i)
        assert a.turn_count(i) == b.turn_count(i)
        assert a.turn(i, 5) == b.turn(i, 5)
        assert a.rewrite(range(100), i, 2) == b.rewrite(range(100), i, 2)
    assert a.initial_prompt(0) != c.initial_prompt(0)
    assert a.turn(0, 0) != c.turn(0, 0)


def test_env_latency_matches_median_p90_and_cut():
    w = SweWorkload(seed=11)
    s = SweSampler(w)
    lat = np.array([s.turn(i, k).env_latency_s for i in range(400) for k in range(50)])
    assert np.median(lat) == pytest.approx(w.env_latency_median_s, rel=0.06)
    assert np.quantile(lat, 0.9) == pytest.approx(w.env_latency_p90_s, rel=0.10)
    assert np.quantile(lat, 0.99) == pytest.approx(60.0, rel=0.35)   # the reference's p99
    assert lat.max() <= w.env_latency_cut_s
    cut = SweSampler(replace(w, env_latency_cut_s=12.0))
    assert max(cut.turn(i, 0).env_latency_s for i in range(2000)) == 12.0


def test_token_counts_and_turns_stay_in_their_ranges():
    w = SweWorkload(seed=5)
    s = SweSampler(w)
    turns = [s.turn_count(i) for i in range(3000)]
    assert min(turns) >= w.turns_min and max(turns) <= w.turns_max
    expected_mean = w.turns_median * math.exp(w.turns_sigma ** 2 / 2)
    assert np.mean(turns) == pytest.approx(expected_mean, rel=0.08)
    for i in range(50):
        p = s.turn(i, i % 7)
        assert w.response_tokens[0] <= p.response_tokens <= w.response_tokens[1]
        assert w.observation_tokens[0] <= len(p.observation_ids) <= w.observation_tokens[1]
        assert all(w.vocab[0] <= t < w.vocab[1] for t in p.observation_ids)
        assert w.initial_prompt_tokens[0] <= len(s.initial_prompt(i)) <= w.initial_prompt_tokens[1]


def test_group_members_share_the_prompt_then_diverge():
    w = SweWorkload(batch_size=8, group_size=4, seed=2)
    s = SweSampler(w)
    prompts = [s.initial_prompt(i) for i in range(8)]
    assert len(set(prompts[:4])) == 1 and len(set(prompts[4:])) == 1
    assert prompts[0] != prompts[4]
    first_obs = {s.turn(i, 0).observation_ids for i in range(4)}
    assert len(first_obs) == 4


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.6, 1.0])
def test_rewrite_fraction_is_honoured(fraction):
    s = SweSampler(SweWorkload(rewrite_fraction=fraction, seed=9))
    context = list(range(5000, 7000))
    out = s.rewrite(context, 3, 1)
    k = round(fraction * len(context))
    assert len(out) == len(context)
    assert out[:len(context) - k] == context[:len(context) - k]
    changed = sum(a != b for a, b in zip(out[len(context) - k:], context[len(context) - k:]))
    assert changed >= 0.99 * k


def test_next_context_is_rewrite_plus_output_plus_observation():
    s = SweSampler(SweWorkload(rewrite_fraction=0.5, seed=1))
    prompt, out, plan = list(range(1000, 1100)), [7, 8, 9], s.turn(0, 0)
    nxt = s.next_context(prompt, out, plan, 0)
    assert nxt[:50] == prompt[:50]
    assert nxt[100:103] == out and tuple(nxt[103:]) == plan.observation_ids


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), f=st.floats(0.0, 1.0), turn=st.integers(0, 40))
def test_rewrite_keeps_length_and_an_untouched_prefix(n, f, turn):
    s = SweSampler(SweWorkload(rewrite_fraction=f))
    ctx = list(range(n))
    out = s.rewrite(ctx, 1, turn)
    keep = n - s.rewritten_tokens(n)
    assert len(out) == n and out[:keep] == ctx[:keep] and 0 <= keep <= n


@pytest.mark.parametrize("bad", [
    dict(batch_size=10, group_size=4), dict(rewrite_fraction=1.5), dict(env_latency_p90_s=0.5),
    dict(initial_prompt_tokens=(32500, 32600)), dict(turns_min=5, turns_max=4), dict(vocab=(10, 10)),
    dict(response_tokens=(0, 10)),
])
def test_validate_refuses_inconsistent_configs(bad):
    with pytest.raises(InvalidConfig):
        SweWorkload(**bad).validate()


def test_turn_records_give_the_effective_prefill_as_delta_l():
    turns = []
    for tid in ("a", "b"):
        for k in range(4):
            cached = 0 if k == 0 else 700 + 400 * k
            turns.append(TurnTelemetry(trajectory_id=tid, step=0, turn_index=k,
                                       prompt_tokens=1000 + 500 * k, cached_tokens=cached,
                                       generated_tokens=100, env_time_s=1.0, request_s=2.0, attempts=1))
    est = fit_step(StepTelemetry(turns=to_turn_records(turns)))
    computed = sum(t.computed_prompt_tokens for t in turns)
    assert est.delta_L == pytest.approx(computed / len(turns))
    assert est.r == 100 and est.S == 4 and est.theta == pytest.approx(0.5)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), f=st.floats(0.0, 1.0), turn=st.integers(0, 40), out=st.integers(0, 50))
def test_next_context_array_is_next_context(n, f, turn, out):
    from pearl_sglang import fastjson
    s = SweSampler(SweWorkload(rewrite_fraction=f))
    prompt, output, plan = list(range(2000, 2000 + n)), list(range(9000, 9000 + out)), s.turn(5, turn)
    as_list = s.next_context(prompt, output, plan, 5)
    as_array = s.next_context_array(np.asarray(prompt, dtype=np.int64), tuple(output), plan, 5)
    assert as_array.dtype == np.int64 and as_array.tolist() == as_list
    assert fastjson.dumps({"input_ids": as_array}) == fastjson.dumps({"input_ids": as_list})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**40), st.integers(0, 5), st.lists(st.integers(0, 2**40), max_size=3))
def test_generators_are_seeded_as_default_rng_seeds_a_list(seed, purpose, key):
    """The sampler seeds from a uint32 array when every word fits (numpy's per-int coercion
    costs ~7 us a generator): the draws must be the list-seeded ones, for any seed."""
    sampler = SweSampler(replace(SweWorkload(), seed=seed))
    ours = sampler._rng(purpose, *key).integers(0, 2**62, size=8)
    theirs = np.random.default_rng([seed, purpose, *key]).integers(0, 2**62, size=8)
    assert ours.tolist() == theirs.tolist()
