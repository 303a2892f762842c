"""The borrowing gate reads what the last step's workers did (core.pool_usage), measured by
the router over real HTTP on emulated workers: borrowed workers that sat idle make the
next step run unborrowed, and a dedicated pool kept busy for a whole step borrows again."""
from __future__ import annotations

import asyncio

from tests.control.conftest import AUTH, cluster_config, running_cluster


async def _generate(c, i: int) -> None:
    r = await c.client.post(c.url + "/generate", timeout=60, json={
        "input_ids": [11 + i] * 32, "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}})
    assert r.status_code == 200, r.text


async def _gate_record(c) -> dict:
    control = (await c.client.get(c.url + "/pearl/state", headers=AUTH)).json()["control"]
    return [d for d in control["decisions"] if d["operation"] == "borrow_gate"][-1]


async def test_idle_borrowed_workers_then_a_busy_pool(tiny_model_dir):
    # A zero toggle cost: equation (7) borrows at every call; only the usage check refuses
    # (the replay check is off: it would refuse step 2, whose tiny requests a larger pool
    # does not shorten; tests/control/test_borrow_replay_gate.py covers it).
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 0.0, "replay_check": False})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        fin = await c.admin("/train_finished", {"step": 0})
        assert fin["borrowing"], fin["reason"]  # nothing measured yet: equation (7) alone
        assert (await _gate_record(c))["pool_usage"]["dedicated_busy_share"] is None
        await c.settle()

        # Step 1 borrows; one short request, then the pool idles.
        await _generate(c, 0)
        await asyncio.sleep(1.0)
        await c.admin("/train_begin", {"step": 1})
        fin = await c.admin("/train_finished", {"step": 1})
        record = await _gate_record(c)
        usage = record["pool_usage"]
        assert usage["borrowed"] and usage["borrowed_busy_share"] < 0.18, usage
        assert not fin["borrowing"] and "borrowed workers were busy" in fin["reason"], fin["reason"]
        assert record["overruled"] and record["overruled"] in fin["reason"]
        assert record["benefit_s"] > record["toggle_cost_s"]  # the prediction said borrow
        await c.settle()

        toggle = c.control.learning.gate.toggle_cost_s
        seen = (c.control.learning.gate.seen_with, c.control.learning.gate.seen_without)

        # Step 2 runs unborrowed with the dedicated workers kept busy to its end.
        stop = asyncio.Event()

        async def client(i: int) -> None:
            while not stop.is_set():
                await _generate(c, i)
        clients = [asyncio.create_task(client(i)) for i in range(6)]
        await asyncio.sleep(1.5)
        await c.admin("/train_begin", {"step": 2})
        stop.set()
        await asyncio.gather(*clients)
        fin = await c.admin("/train_finished", {"step": 2})
        usage = (await _gate_record(c))["pool_usage"]
        assert not usage["borrowed"] and usage["dedicated_busy_share"] >= 0.65, usage
        assert fin["borrowing"], fin["reason"]
        # The step the check kept unborrowed taught the toggle cost nothing.
        gate = c.control.learning.gate
        assert (gate.seen_with, gate.seen_without) == seen and gate.toggle_cost_s == toggle
        state = (await c.client.get(c.url + "/pearl/state", headers=AUTH)).json()["control"]
        assert state["gate"]["pool_usage"] == usage
        text = (await c.client.get(c.url + "/metrics", headers=AUTH)).text
        assert f'pearl_gate_busy_share{{zone="dedicated"}} {usage["dedicated_busy_share"]!r}' in text
        assert 'pearl_gate_busy_share{zone="borrowed"}' not in text  # step 2 did not borrow


async def test_the_check_is_configurable_and_off_at_zero(tiny_model_dir):
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 0.0,
                                                  "min_dedicated_busy_share": 0.0, "min_borrowed_busy_share": 0.0})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        assert (await c.admin("/train_finished", {"step": 0}))["borrowing"]
        await c.settle()
        await _generate(c, 0)
        await asyncio.sleep(1.0)  # the pool idles
        await c.admin("/train_begin", {"step": 1})
        fin = await c.admin("/train_finished", {"step": 1})
        assert fin["borrowing"], fin["reason"]
        assert (await _gate_record(c))["pool_usage"]["borrowed_busy_share"] < 0.18
