"""Intra-scale toggle: borrow overlap GPUs after train_finished, return them on train_begin."""
from __future__ import annotations

import asyncio

from pearl_sglang.core.state import Activity, Zone
from tests.control.conftest import cluster_config, running_cluster


def overlap(table):
    return [w for w in table.rollout_workers() if w.zone is Zone.OVERLAP]


async def test_bootstrap_then_borrow_and_return(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        assert c.table.active_topology().colocated == 2
        assert (await c.generate([1, 2, 3]))["meta_info"]["completion_tokens"] == 16
        out = await c.admin("/train_begin", {"step": 0})
        assert out["returned_gpus"] == ["t0:0", "t0:1"] and out["elapsed_s"] >= 0
        fin = await c.admin("/train_finished", {"step": 0})
        assert fin["borrowing"] and fin["reason"] == "ungated borrowing"
        await c.settle()
        assert [w.activity for w in overlap(c.table)] == [Activity.ACTIVE, Activity.ACTIVE]
        assert c.table.active_topology().colocated == 4
        launched = c.launcher.launches
        # Requests during and after the return keep flowing, none lost.
        flood = [asyncio.ensure_future(c.generate([5, i, 7], n=200)) for i in range(12)]
        await asyncio.sleep(0.2)
        out = await c.admin("/train_begin", {"step": 1})
        assert c.table.training_owns_overlap
        for w in overlap(c.table):
            assert w.activity is Activity.INACTIVE
            engine = c.launcher.worker(w.slot).engine
            assert engine.released_tags, f"slot {w.slot} still holds GPU memory"
        outs = await asyncio.gather(*flood)
        assert all(o["meta_info"]["completion_tokens"] == 200 for o in outs)
        # Borrowing again resumes the retained processes: no new launch.
        await c.admin("/train_finished", {"step": 1})
        await c.settle()
        assert c.launcher.launches == launched
        assert [w.activity for w in overlap(c.table)] == [Activity.ACTIVE, Activity.ACTIVE]
        state = (await c.client.get(c.url + "/pearl/state", headers={"Authorization": "Bearer control-test-token"})).json()
        phases = state["control"]["phases"]
        assert "intra_scale/activation" in phases and "intra_scale/deactivation" in phases


async def test_gate_closed_keeps_training_gpus(tiny_model_dir):
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 1e9})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        fin = await c.admin("/train_finished", {"step": 0})
        assert not fin["borrowing"] and "T_toggle" in fin["reason"]
        await c.settle()
        assert overlap(c.table) == [] and c.launcher.launches == 2


async def test_out_of_order_and_duplicate_calls(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        await c.admin("/train_finished", {"step": 0}, expect=409)
        first = await c.admin("/train_begin", {"step": 0, "request_id": "tb-0"})
        again = await c.admin("/train_begin", {"step": 0, "request_id": "tb-0"})
        assert not first["duplicate"] and again["duplicate"] and again["step"] == 0
        err = await c.admin("/train_begin", {"step": 1}, expect=409)
        assert err["error"]["type"] == "out_of_order"
        await c.admin("/train_begin", {"step": "x"}, expect=400)


async def test_gate_explores_and_reports_prediction_and_learned_cost(tiny_model_dir):
    """A gate that would borrow on a small benefit runs one step unborrowed to learn, and
    the state and metrics show what it learned and predicted vs observed step time."""
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 1e-9,
                                                  "exploration_rate": 1.0, "explore_max_benefit_ratio": 1e15})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        fin = await c.admin("/train_finished", {"step": 0})
        assert not fin["borrowing"] and fin["reason"].startswith("explore:")
        await c.settle()
        assert overlap(c.table) == []
        await c.admin("/train_begin", {"step": 1})
        headers = {"Authorization": "Bearer control-test-token"}
        control = (await c.client.get(c.url + "/pearl/state", headers=headers)).json()["control"]
        assert control["gate"]["explored"] == 1 and control["gate"]["seen_without"] == 1
        (last,) = control["step_predictions"]
        assert last["borrowed"] is False and last["predicted_s"] > 0 and last["observed_s"] > 0
        text = (await c.client.get(c.url + "/metrics", headers=headers)).text
        assert "pearl_gate_toggle_cost_seconds 1e-09" in text
        assert 'pearl_step_seconds{kind="predicted"}' in text and 'pearl_step_seconds{kind="observed"}' in text
        assert "pearl_gate_explored_steps 1.0" in text


async def test_exploration_rate_is_validated(tiny_model_dir):
    import pytest
    from pearl_sglang.control.cluster_config import ConfigError
    with pytest.raises(ConfigError, match=r"exploration rate must be in \[0, 1\]"):
        cluster_config(tiny_model_dir, gate={"exploration_rate": 2.0})
