"""Routing policies behind the same filters, and the load model's owed work."""
from __future__ import annotations

import pytest

from pearl_sglang.control.attach import attached_table
from pearl_sglang.core.placement import WorkerLoad
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.inflight import InFlightRegistry
from pearl_sglang.router.load import LoadModel
from pearl_sglang.router.selection import TOKEN_BLOCK, Selector, prefix_key


def _table(n: int):
    return attached_table(regular=tuple(f"http://w{i}" for i in range(n)))


def _route(sel: Selector, table, key, loads=None, trajectory=None):
    target = sel.choose(table, loads=loads or {}, key=key, context=len(key) * TOKEN_BLOCK, trajectory=trajectory)
    sel.remember(target, key, trajectory)
    return target.worker.slot


def test_cost_spreads_a_group_that_cache_aware_keeps_on_one_worker():
    table = _table(4)
    key = prefix_key(list(range(2048)), None)
    for name, expected in (("cost", [2, 2, 2, 2]), ("cache_aware", [8, 0, 0, 0])):
        sel, running = Selector(routing=name), {s: 0 for s in range(4)}
        for _ in range(8):
            slot = _route(sel, table, key, {s: WorkerLoad(running=n) for s, n in running.items()})
            running[slot] += 1
        assert sorted(running.values(), reverse=True) == expected, name


def test_a_shared_prompt_is_no_members_home_but_a_previous_turn_is():
    """Every worker holds a GRPO group's prompt; worker 0 served it last and runs 8
    sequences, the others 7. A member's first turn (trajectory id, no turn yet) takes a
    7-worker: the prompt's latest server gets no margin to take a 9th. A trajectory whose
    previous turn ran on worker 0 stays there within the margin."""
    table = _table(8)
    sel = Selector(routing="cost")
    prompt = list(range(512))
    key = prefix_key(prompt, None)
    busy = {s: WorkerLoad(running=100) for s in range(8)}
    for slot in [*range(1, 8), 0]:   # each worker serves the prompt once, worker 0 last
        assert _route(sel, table, key, {**busy, slot: WorkerLoad()}, trajectory=f"m{slot}") == slot
    assert sel.holder(key) == 0
    loads = {s: WorkerLoad(running=8 if s == 0 else 7) for s in range(8)}
    assert _route(sel, table, key, loads, trajectory="first-turn") != 0
    nxt = prefix_key(prompt + list(range(1000, 1100)), None)
    assert _route(sel, table, nxt, loads, trajectory="m0") == 0


def test_cache_aware_yields_to_load_past_sglang_routers_thresholds():
    table = _table(2)
    key = prefix_key(list(range(640)), None)
    sel = Selector(routing="cache_aware")
    assert _route(sel, table, key) == 0
    # 64 more requests and 1.5x the load: the holder still wins; 65 more: the idlest.
    assert _route(sel, table, key, {0: WorkerLoad(running=64)}) == 0
    assert _route(sel, table, key, {0: WorkerLoad(running=65)}) == 1
    # Below the cache threshold: the worker with the smallest prefix tree.
    assert _route(sel, table, prefix_key(list(range(10_000, 10_640)), None)) == 1 - sel.holder(key)


def test_round_robin_and_cost_rotate_short_requests_over_the_pool():
    table = _table(5)
    for name in ("round_robin", "cost"):
        sel = Selector(routing=name)
        assert sorted(_route(sel, table, ()) for _ in range(5)) == [0, 1, 2, 3, 4], name


def test_a_trajectory_follows_its_prefix_under_cost():
    table = _table(3)
    sel = Selector(routing="cost")
    ids = list(range(8192))
    first = _route(sel, table, prefix_key(ids, None), trajectory="t")
    loads = {s: WorkerLoad(running=1) for s in range(3) if s != first}
    nxt = _route(sel, table, prefix_key(ids + list(range(300)), None), loads={**loads, first: WorkerLoad(running=2)},
                 trajectory="t")
    assert nxt == first


def test_unknown_routing_policy_is_a_config_error():
    with pytest.raises(ValueError, match="--routing-policy"):
        RouterConfig(routing_policy="random").validate()


def test_owed_trajectories_count_until_their_next_turn_or_expiry():
    loads = LoadModel(InFlightRegistry(), owed_ttl_s=10.0)
    loads.turn_ended("a", 0, now=0.0)
    loads.turn_ended("b", 0, now=1.0)
    loads.turn_ended(12345, 1, now=2.0)        # anonymous: the last block of prompt + output
    snap = loads.snapshot(3.0)
    assert (snap[0].owed, snap[1].owed) == (2.0, 1.0)
    loads.turn_started("a")
    loads.turn_started(None, (7, 12345, 999))  # the next prompt's blocks
    assert loads.snapshot(3.0)[0].owed == 1.0 and 1 not in loads.snapshot(3.0)
    assert 0 not in loads.snapshot(11.5)       # b expired


def test_queued_prefill_counts_until_the_first_chunk_and_reports_merge():
    loads = LoadModel(InFlightRegistry())
    loads.prefill_sent("r1", 2, 4000)
    loads.prefill_sent("r2", 2, 1000)
    assert loads.snapshot(0.0)[2].queued_prefill_tokens == 5000
    loads.prefill_done("r1")
    loads.prefill_done("r1")
    assert loads.snapshot(0.0)[2].queued_prefill_tokens == 1000
    loads.report(3, requests=7, now=0.0)
    assert loads.snapshot(1.0)[3].running == 7
    assert 3 not in loads.snapshot(100.0) or loads.snapshot(100.0)[3].running == 0


def test_a_stale_worker_report_does_not_count_turns_that_ended_since_twice():
    """The worker was asked while the router's own 8 turns ran there; the turns ended since
    and are owed (between turns). Its report, still fresh by age, adds only what other
    clients sent: 8 sequences owed there, not 8 owed plus 8 reported running."""
    inflight = InFlightRegistry()
    loads = LoadModel(inflight, report_ttl_s=5.0)
    for i in range(8):
        inflight.assign(inflight.open(f"r{i}"), (0,), ("http://w0",))
    loads.report(0, requests=8, now=0.0)
    for i in range(8):
        inflight.close(f"r{i}")
        loads.turn_ended(f"t{i}", 0, now=0.5)
    snap = loads.snapshot(1.0)[0]
    assert (snap.running, snap.owed) == (0, 8.0)
    loads.report(0, requests=11, now=1.5)   # 11 requests from other clients
    assert loads.snapshot(2.0)[0].sequences == 19.0


def test_utilization_counts_busy_time_tokens_and_steps():
    from pearl_sglang.router.utilization import Utilization

    now = [0.0]
    u = Utilization(clock=lambda: now[0])
    u.occupancy(0, 0, 1)
    now[0] = 2.0
    u.occupancy(0, 1, 2)
    u.completed(0, prompt_tokens=1000, cached_tokens=600, generated_tokens=50)
    now[0] = 3.0
    u.occupancy(0, 2, 0)
    u.occupancy(1, 0, 1)
    now[0] = 4.0
    step = u.close_step()                     # slot 1 is still busy: its second is split off
    assert step["workers"]["0"] == {"busy_s": 3.0, "prefill_tokens": 400, "generated_tokens": 50,
                                    "cached_tokens": 600, "requests": 1}
    assert step["workers"]["1"]["busy_s"] == 1.0
    assert step["busy_busiest_over_mean"] == 1.5
    now[0] = 5.0
    assert u.state()["current_step"]["workers"]["1"]["busy_s"] == 1.0
    assert u.current_totals()[1].busy_s == 2.0
    # The new step began busy (slot 1 across the boundary), not at slot 0's next request;
    # a slot that becomes busy at the instant a step closes is not in the closed step.
    u.occupancy(0, 0, 1)
    u.occupancy(0, 1, 0)
    u.occupancy(1, 1, 0)
    u.occupancy(2, 0, 1)
    closed = u.close_step()
    assert closed["started"] == 4.0 and "2" not in closed["workers"]
    now[0] = 6.0
    u.occupancy(2, 1, 0)
    assert u.close_step()["workers"]["2"]["busy_s"] == 1.0
    now[0] = 7.0
    assert u.close_step()["started"] is None  # nothing ran in it


async def test_attach_mode_weighs_decode_with_the_measured_tokens_per_turn():
    from pearl_sglang.router.app import _ProfileRates
    from pearl_sglang.router.selection import DEFAULT_RATES

    class _St:
        control = None

    rates = _ProfileRates(_St())
    assert rates() == DEFAULT_RATES
    for _ in range(200):
        rates.observe_generated(96)
    assert abs(rates().r - 96) < 1 and rates().b == DEFAULT_RATES.b


def test_the_cluster_config_names_the_routing_policy_and_the_flag_wins(tiny_model_dir):
    from pearl_sglang.control.cluster_config import ConfigError
    from pearl_sglang.state_store import StateStore
    from pearl_sglang.server.compose import build_app
    from pearl_sglang.router.state import ROUTER
    from tests.control.conftest import cluster_config

    with pytest.raises(ConfigError, match="routing_policy"):
        cluster_config(tiny_model_dir, routing_policy="random")
    cluster = cluster_config(tiny_model_dir, routing_policy="round_robin")
    store = StateStore(_table(2))
    assert build_app(RouterConfig(), store, cluster)[ROUTER].selector.routing.name == "round_robin"
    flag = RouterConfig(routing_policy="cache_aware")
    assert build_app(flag, store, cluster)[ROUTER].selector.routing.name == "cache_aware"
    assert build_app(RouterConfig(), store)[ROUTER].selector.routing.name == "cost"
