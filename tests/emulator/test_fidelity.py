"""The engine reproduces its own profile's closed-form costs (within 5%), and colocated
decode slows down when prefills arrive."""
from __future__ import annotations

import pytest

from benchmarks.harness.virtual_cluster import VirtualCluster
from pearl_sglang.emulator import (Bootstrap, EngineConfig, GenerateRequest, DisaggregationMode, SamplingParams,
                                   load_profile)

Q8 = load_profile("qwen3-8b-h800-tp2")
Q30 = load_profile("qwen3-30b-a3b-h800-tp2")
NOCACHE = EngineConfig(prefix_cache=False)


def prompt(i: int, n: int) -> tuple[int, ...]:
    return tuple(range(i * n, (i + 1) * n))


def gen(rid: str, p, n: int) -> GenerateRequest:
    return GenerateRequest(rid, p, SamplingParams(max_new_tokens=n, ignore_eos=True))


def steady_decode_throughput(profile, batch: int, ctx: int) -> float:
    c = VirtualCluster()
    e = c.add_engine(profile, NOCACHE)
    hs = [e.submit(gen(f"r{i}", prompt(i, ctx), 400)) for i in range(batch)]
    c.run(stop=lambda: all(h.output_ids for h in hs))
    g0, t0 = e.stats.generation_tokens, c.clock.now()
    c.run(until=t0 + 1.0)
    assert all(not h.finished for h in hs)
    return (e.stats.generation_tokens - g0) / (c.clock.now() - t0)


@pytest.mark.parametrize("profile,batch,ctx", [(Q8, 64, 8192), (Q8, 8, 16384), (Q30, 8, 16384),
                                               (Q30, 64, 8192)])
def test_decode_throughput_matches_closed_form(profile, batch: int, ctx: int) -> None:
    measured = steady_decode_throughput(profile, batch, ctx)
    assert measured == pytest.approx(profile.decode_throughput(batch, ctx + 50), rel=0.05)


@pytest.mark.parametrize("tokens", [8192, 32768])
def test_prefill_throughput_matches_closed_form(tokens: int) -> None:
    c = VirtualCluster()
    e = c.add_engine(Q8, NOCACHE)
    h = e.submit(gen("p", prompt(1, tokens), 1))
    c.run()
    assert tokens / h.first_token_time == pytest.approx(Q8.prefill_throughput(tokens), rel=0.05)


def test_kv_transfer_of_16k_context_matches_closed_form() -> None:
    c = VirtualCluster()
    p = c.add_engine(Q8, EngineConfig(role=DisaggregationMode.PREFILL, bootstrap_port=1))
    d = c.add_engine(Q8, EngineConfig(role=DisaggregationMode.DECODE, bootstrap_port=2))
    r = GenerateRequest("kv", prompt(3, 16384), SamplingParams(max_new_tokens=4, ignore_eos=True),
                        bootstrap=Bootstrap("127.0.0.1", 1, 77))
    hd, hp = d.submit(r), p.submit(r)
    c.run()
    assert hp.finish_time - hp.first_token_time == pytest.approx(Q8.kv_transfer_s(16384), rel=0.05)
    assert Q8.kv_transfer_s(16384) == pytest.approx(0.0503, rel=0.01)
    assert hd.first_token_time == pytest.approx(hp.finish_time)


def test_colocated_decode_slows_when_prefills_arrive() -> None:
    def run(with_arrivals: bool) -> float:
        c = VirtualCluster()
        e = c.add_engine(Q8, NOCACHE)
        hs = [e.submit(gen(f"d{i}", prompt(i, 2048), 2000)) for i in range(32)]
        c.run(stop=lambda: all(h.output_ids for h in hs))
        t0 = c.clock.now()
        tokens0 = sum(len(h.output_ids) for h in hs)
        if with_arrivals:  # a 4K-token turn every 200 ms, as tool results come back
            for k in range(5):
                c.call_at(t0 + 0.2 * k, lambda k=k: e.submit(gen(f"p{k}", prompt(100 + k, 4096), 1)))
        c.run(until=t0 + 1.0)
        return (sum(len(h.output_ids) for h in hs) - tokens0) / 1.0
    quiet, busy = run(False), run(True)
    prefill_share = 5 * (Q8.cost.prefill_fixed_s + Q8.cost.prefill_tokens_s(4096, 0))  # ~0.27 s
    assert busy / quiet == pytest.approx(1.0 - prefill_share, abs=0.05)
    mixed = VirtualCluster()
    e = mixed.add_engine(Q8, EngineConfig(prefix_cache=False, mixed_chunk=True))
    hs = [e.submit(gen(f"m{i}", prompt(i, 2048), 50)) for i in range(8)]
    mixed.run()
    assert all(len(h.output_ids) == 50 for h in hs)


@pytest.mark.parametrize("stepping", [True, False])
def test_phase_counters_split_prefill_from_decode(stepping: bool) -> None:
    """Figure 2(b)'s measurement: computed prompt tokens and the time of iterations that
    prefill, against decode-only iterations (stretches included) and their tokens."""
    c = VirtualCluster()
    e = c.add_engine(Q8, EngineConfig(prefix_cache=False, decode_stretches=stepping))
    hs = [e.submit(gen(f"r{i}", prompt(i, 3000), 200)) for i in range(4)]
    c.run()
    p = e.stats.phases()
    assert p["prefill_tokens"] == 4 * 3000
    assert p["generated_tokens"] == sum(len(h.output_ids) for h in hs) == 800
    assert p["prefill_iteration_s"] + p["decode_only_s"] == pytest.approx(p["busy_s"])
    assert p["prefill_iteration_s"] == pytest.approx(
        sum(Q8.cost.prefill_fixed_s + Q8.cost.prefill_tokens_s(3000, 0) for _ in range(4)), rel=0.05)
    # every token but each request's first (sampled at the end of its prefill) is decode-only
    assert p["decode_only_tokens"] == 800 - 4
    rate = p["decode_only_tokens"] / p["decode_only_s"]
    assert rate == pytest.approx(4 / Q8.cost.decode_s(4, 4 * 3100), rel=0.1)
