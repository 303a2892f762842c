"""The in-process engine on virtual time: generation semantics and control operations."""
from __future__ import annotations

from benchmarks.harness.virtual_cluster import VirtualCluster
from pearl_sglang.emulator import EngineConfig, GenerateRequest, SamplingParams, load_profile
from pearl_sglang.emulator.request import OpResult, RequestRejected, Stage

TINY = load_profile("tiny")
PROMPT = tuple(range(100, 180))


def req(rid: str, prompt=PROMPT, n: int = 32, **kw) -> GenerateRequest:
    kw.setdefault("ignore_eos", True)
    return GenerateRequest(rid=rid, input_ids=tuple(prompt), sampling=SamplingParams(max_new_tokens=n, **kw))


def run_one(cluster: VirtualCluster, engine, r: GenerateRequest):
    h = engine.submit(r)
    cluster.run()
    return h


def test_same_context_same_tokens_on_any_engine() -> None:
    c = VirtualCluster()
    a, b = c.add_engine(TINY), c.add_engine(TINY, EngineConfig(max_running_requests=3))
    ha = run_one(c, a, req("a"))
    hb = run_one(c, b, req("b"))
    assert ha.output_ids == hb.output_ids and len(ha.output_ids) == 32
    assert ha.finish_reason.type == "length" and ha.finish_reason.length == 32
    assert ha.weight_versions == [["default", 0, 32]]


def test_abort_keeps_partial_and_resume_elsewhere_continues_exactly() -> None:
    c = VirtualCluster()
    a, b = c.add_engine(TINY), c.add_engine(TINY)
    full = run_one(c, a, req("full", n=40)).output_ids
    h = a.submit(req("job-1", n=40))
    c.run(until=c.clock.now() + 0.03)
    assert a.abort("job") == 0  # a bare prefix is ignored, as in SGLang 0.5.23
    assert a.abort("job-1") == 1
    c.run()
    part = h.output_ids
    assert h.finish_reason.type == "abort" and h.finish_reason.message == "Aborted"
    assert 0 < len(part) < 40 and part == full[: len(part)]
    rest = run_one(c, b, req("resume", PROMPT + tuple(part), n=40 - len(part)))
    assert part + rest.output_ids == full


def test_abort_in_waiting_queue_message() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    e.pause("in_place")
    h = e.submit(req("w"))
    assert h.stage == Stage.HELD
    e.abort("w")
    assert h.finish_reason.message == "Abort in waiting queue" and h.output_ids == []


def test_weight_version_changes_tokens_and_spans_in_place_update() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    base = run_one(c, e, req("base")).output_ids
    h = e.submit(req("spanning", n=30))
    c.run(until=c.clock.now() + 0.04)
    e.pause("in_place")
    done: list[OpResult] = []
    e.update_weights("distributed", weight_version="v2", on_done=done.append)
    c.run()
    assert done and done[0].success and e.version == "v2"
    k = len(h.output_ids)
    assert 0 < k < 30 and not h.finished
    e.continue_generation()
    c.run()
    assert h.weight_versions == [["default", 0, k], ["v2", k, 30]]
    assert h.output_ids[:k] == base[:k] and h.output_ids[k:] != base[k:30]


def test_weight_update_without_pause_drains_and_holds_new_requests() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    first = e.submit(req("r1", n=20))
    c.run(until=0.01)
    done: list[OpResult] = []
    e.update_weights("disk", weight_version="v3", on_done=done.append)
    second = e.submit(req("r2", n=5))
    assert second.stage == Stage.HELD
    c.run()
    assert first.weight_versions == [["default", 0, 20]]
    assert second.weight_versions == [["v3", 0, 5]]
    assert second.arrival_time < first.finish_time < second.first_token_time


def test_pause_abort_and_retract_modes() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    h = e.submit(req("x", n=50))
    c.run(until=0.02)
    e.pause("abort")
    assert h.finish_reason.type == "abort" and h.output_ids
    e.continue_generation()
    h2 = e.submit(req("y", n=30))
    c.run(until=c.clock.now() + 0.02)
    e.pause("retract")
    assert h2.num_retractions == 1 and e.loads().num_running_reqs == 0
    e.continue_generation()
    c.run()
    assert len(h2.output_ids) == 30 and h2.output_ids == run_one(c, e, req("z", n=30)).output_ids


def test_stop_token_min_new_tokens_and_natural_eos() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    base = run_one(c, e, req("b", n=20)).output_ids
    stop = base[5]
    h = run_one(c, e, req("s", n=20, stop_token_ids=frozenset({stop})))
    assert h.finish_reason.type == "stop" and h.finish_reason.matched == stop
    assert h.output_ids[-1] == stop
    h = run_one(c, e, req("m", n=20, stop_token_ids=frozenset({stop}), min_new_tokens=10))
    assert len(h.output_ids) > 10
    eos_prof = TINY.replace(eos_probability=0.2)
    e2 = c.add_engine(eos_prof)
    hs = [e2.submit(req(f"e{i}", prompt=(i, 7, 9), n=100, ignore_eos=False)) for i in range(20)]
    c.run()
    stops = [h for h in hs if h.finish_reason.type == "stop"]
    assert len(stops) >= 15 and all(h.output_ids[-1] == TINY.eos_token_id for h in stops)


def test_prefix_cache_reuses_multi_turn_prefix() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    t1 = run_one(c, e, req("t1", n=16))
    turn2 = PROMPT + tuple(t1.output_ids) + tuple(range(500, 540))
    t2 = run_one(c, e, req("t2", turn2, n=8))
    page = TINY.cache_page_tokens
    assert t2.cached_tokens >= (len(PROMPT) + 15) // page * page
    off = c.add_engine(TINY, EngineConfig(prefix_cache=False))
    assert run_one(c, off, req("t3", turn2, n=8)).cached_tokens == 0


def test_kv_capacity_queues_and_retracts() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY, EngineConfig(max_total_tokens=1200, prefix_cache=False))
    hs = [e.submit(req(f"r{i}", prompt=range(i * 1000, i * 1000 + 200), n=150)) for i in range(8)]
    peak = 0
    while c.run(until=c.clock.now() + 0.01) and not all(h.finished for h in hs):
        peak = max(peak, e.loads().num_used_tokens)
        assert e.loads().num_used_tokens <= 1200
    assert all(len(h.output_ids) == 150 for h in hs)
    assert sum(h.num_retractions for h in hs) > 0
    alone = run_one(c, c.add_engine(TINY), req("a", prompt=range(3000, 3200), n=150))
    assert hs[3].output_ids == alone.output_ids


def test_validation_rejections() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    for bad in (req("empty", prompt=()), req("long", prompt=range(8000), n=500)):
        try:
            e.submit(bad)
        except RequestRejected as err:
            assert err.status == 400
        else:
            raise AssertionError("not rejected")


def test_release_resume_state_machine() -> None:
    c = VirtualCluster()
    cfg = EngineConfig(memory_saver=True)
    e = c.add_engine(TINY, cfg)
    ref = run_one(c, e, req("ref")).output_ids
    busy = e.submit(req("busy", n=50))
    got: list[OpResult] = []
    e.release_memory(on_done=got.append)
    assert not got[-1].success  # not idle
    c.run()
    assert busy.finished
    e.release_memory(on_done=got.append)
    c.run()
    assert got[-1].success and e.released_tags == {"kv_cache", "weights", "cuda_graph"}
    try:
        e.submit(req("while-released"))
    except RequestRejected as err:
        assert err.status == 503
    else:
        raise AssertionError("released worker generated")
    e.resume_memory(["weights"], on_done=got.append)
    c.run()
    e.resume_memory(["weights"], on_done=got.append)
    assert not got[-1].success and "KeyError" in got[-1].message
    e.resume_memory(["kv_cache", "cuda_graph"], on_done=got.append)
    c.run()
    garbage = run_one(c, e, req("after-resume")).output_ids
    assert garbage != ref  # weights are not valid until a weight sync
    e.update_weights("distributed", weight_version="default", on_done=got.append)
    c.run()
    assert run_one(c, e, req("synced")).output_ids == ref
    backup = c.add_engine(TINY, EngineConfig(memory_saver=True, weights_cpu_backup=True))
    backup.release_memory()
    c.run()
    backup.resume_memory()
    c.run()
    assert run_one(c, backup, req("b")).output_ids == ref


def test_release_without_memory_saver_is_a_noop() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY)
    got: list[OpResult] = []
    e.release_memory(on_done=got.append)
    assert got[-1].success and not e.released_tags
    assert run_one(c, e, req("ok")).finished


def test_timing_follows_profile() -> None:
    c = VirtualCluster()
    e = c.add_engine(TINY, EngineConfig(prefix_cache=False))
    h = run_one(c, e, req("t", n=10))
    cost = TINY.cost
    prefill = cost.prefill_fixed_s + cost.prefill_tokens_s(len(PROMPT), 0)
    assert abs(h.first_token_time - prefill) < 1e-9
    decode = sum(cost.decode_s(1, len(PROMPT) + k) for k in range(1, 10))
    assert abs(h.finish_time - (prefill + decode)) < 1e-9



def _finish_order(config: EngineConfig, priorities) -> list:
    """One request runs at a time behind a blocker; the queued requests' priorities in the
    order they finished."""
    c = VirtualCluster()
    e = c.add_engine(TINY, config)
    e.submit(req("blocker", n=64))
    handles = [(p, e.submit(GenerateRequest(rid=f"q{i}", input_ids=tuple(range(i * 100, i * 100 + 50)),
                                            sampling=SamplingParams(max_new_tokens=8, ignore_eos=True),
                                            priority=p)))
               for i, p in enumerate(priorities)]
    c.run()
    assert all(h.finished for _, h in handles)
    return [p for p, h in sorted(handles, key=lambda ph: ph[1].finish_time)]


def test_priority_orders_the_waiting_queue_only_with_priority_scheduling() -> None:
    prios = [None, 0, 5, 3, 5]
    assert _finish_order(EngineConfig(max_running_requests=1), prios) == prios
    assert _finish_order(EngineConfig(max_running_requests=1, priority_sign=-1), prios) == [5, 5, 3, 0, None]
    assert _finish_order(EngineConfig(max_running_requests=1, priority_sign=1), prios) == [0, 3, 5, 5, None]
