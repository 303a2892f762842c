"""PD disaggregation and role switching between in-process engines."""
from __future__ import annotations

import pytest

from benchmarks.harness.virtual_cluster import VirtualCluster
from pearl_sglang.emulator import (Bootstrap, EngineConfig, GenerateRequest, DisaggregationMode, SamplingParams,
                                   load_profile)
from pearl_sglang.emulator.request import OpResult, RequestRejected, Stage

TINY = load_profile("tiny")
PROMPT = tuple(range(300, 1300))


def pd_pair(c: VirtualCluster, **kw):
    p = c.add_engine(TINY, EngineConfig(role=DisaggregationMode.PREFILL, bootstrap_port=9100, **kw))
    d = c.add_engine(TINY, EngineConfig(role=DisaggregationMode.DECODE, bootstrap_port=9101, **kw))
    return p, d


def pd_req(rid: str, room: int, n: int = 20, port: int = 9100, prompt=PROMPT) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=prompt, sampling=SamplingParams(max_new_tokens=n, ignore_eos=True),
                           bootstrap=Bootstrap("127.0.0.1", port, room))


def test_pd_output_equals_colocated_and_prefill_reports_one_token() -> None:
    c = VirtualCluster()
    p, d = pd_pair(c)
    colo = c.add_engine(TINY)
    ref = colo.submit(GenerateRequest("ref", PROMPT, SamplingParams(max_new_tokens=20, ignore_eos=True)))
    r = pd_req("x", room=42)
    hd = d.submit(r)  # decode first: it must wait for the prefill
    c.run(until=0.05)
    assert hd.stage == Stage.AWAIT_KV and not hd.output_ids
    hp = p.submit(r)
    c.run()
    assert hp.output_ids == ref.output_ids[:1]
    assert hp.finish_reason.type == "length" and hp.finish_reason.length == 0
    assert hd.output_ids == ref.output_ids
    # decode got the KV only after prefill compute plus the modelled transfer
    transfer = TINY.kv_transfer_s(len(PROMPT))
    assert hd.first_token_time == pytest.approx(hp.finish_time)
    assert hp.finish_time - hp.first_token_time == pytest.approx(transfer, rel=1e-6)


def test_prefill_waits_for_its_decode_before_prefilling() -> None:
    c = VirtualCluster()
    p, d = pd_pair(c)
    hp = p.submit(pd_req("y", 7))
    c.run(until=0.5)
    assert hp.stage == Stage.BOOTSTRAP and p.loads().prefill_bootstrap_queue_reqs == 1
    hd = d.submit(pd_req("y", 7))
    c.run()
    assert hd.finished and hp.finished and len(hd.output_ids) == 20


def test_pd_requires_a_room_and_times_out_without_a_peer() -> None:
    c = VirtualCluster()
    p, d = pd_pair(c, pd_timeout_s=2.0)
    with pytest.raises(RequestRejected, match="without bootstrap room"):
        d.submit(GenerateRequest("n", PROMPT, SamplingParams()))
    hd = d.submit(pd_req("lonely", 1))
    c.run()
    assert hd.finish_reason.type == "abort" and hd.finish_reason.status_code == 503
    assert hd.finish_time == pytest.approx(2.0, abs=0.01)
    bad = d.submit(pd_req("nowhere", 2, port=1))
    c.run()
    assert "unreachable" in bad.finish_reason.message


def test_fake_bootstrap_host_needs_no_prefill() -> None:
    c = VirtualCluster()
    _, d = pd_pair(c)
    r = GenerateRequest("f", PROMPT, SamplingParams(max_new_tokens=4, ignore_eos=True),
                        bootstrap=Bootstrap("2.2.2.2", None, 0))
    h = d.submit(r)
    c.run()
    assert len(h.output_ids) == 4


def test_concurrent_transfers_share_bandwidth() -> None:
    c = VirtualCluster()
    p, d = pd_pair(c)
    hs = []
    p.pause("in_place")  # queue all four, then release them into one prefill batch
    for i in range(4):
        r = pd_req(f"c{i}", 100 + i, n=2, prompt=tuple(range(i * 5000, i * 5000 + 120)))
        d.submit(r)
        hs.append(p.submit(r))
    c.run(until=0.01)
    p.continue_generation()
    c.run()
    durations = [h.finish_time - h.first_token_time for h in hs]
    alone = TINY.kv_transfer_s(120)
    assert durations == pytest.approx([4 * alone] * 4, rel=1e-6)


def test_abort_on_prefill_fails_the_decode() -> None:
    c = VirtualCluster()
    p, d = pd_pair(c)
    r = pd_req("ab", 5, prompt=tuple(range(4000)))
    hd, hp = d.submit(r), p.submit(r)
    while hp.stage != Stage.TRANSFER:
        c.run(until=c.clock.now() + 0.005)
    assert d.loads().decode_transfer_queue_reqs == 1
    p.abort("ab")
    c.run()
    assert hp.finish_reason.type == "abort"
    assert hd.finish_reason.type == "abort" and "KV transfer failed" in hd.finish_reason.message


def test_role_switch_rules_and_swap() -> None:
    c = VirtualCluster()
    p, d = pd_pair(c, pd_role_switch=True)
    got: list[OpResult] = []
    r = pd_req("busy", 9, n=200)
    d.submit(r), p.submit(r)
    c.run(until=0.2)
    d.switch_role("prefill", on_done=got.append)
    assert not got[-1].success and got[-1].message == (
        "instance is not idle; drain all requests before switching")
    c.run()
    p.switch_role("decode", on_done=got.append)
    assert got[-1].message == "decode_cuda_graph_memory_gb is required before capturing decode graphs"
    p.switch_role("decode", decode_cuda_graph_memory_gb=0, on_done=got.append)
    d.switch_role("prefill", on_done=got.append)
    p.switch_role("decode", on_done=got.append)  # still switching: not idle? it is idle; same role later
    c.run()
    assert p.role == DisaggregationMode.DECODE and d.role == DisaggregationMode.PREFILL
    assert got[-3].as_dict() == {"old_role": "prefill", "new_role": "decode", "safe_to_restore": True}
    r2 = pd_req("after", 10, port=9101)
    hd, hp = p.submit(r2), d.submit(r2)
    c.run()
    assert len(hd.output_ids) == 20 and hp.finish_reason.length == 0
    colo = c.add_engine(TINY, EngineConfig(pd_role_switch=True))
    colo.switch_role("decode", on_done=got.append)
    assert not got[-1].success
