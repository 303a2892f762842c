"""Retried admin calls act once, per operation: a request id names one call of one endpoint."""
from __future__ import annotations

from tests.control.conftest import cluster_config, running_cluster


async def test_a_request_id_reused_on_another_endpoint_is_another_call(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        begun = await c.admin("/train_begin", {"step": 0, "request_id": "step-0"})
        assert not begun["duplicate"] and c.control.training
        finished = await c.admin("/train_finished", {"step": 0, "request_id": "step-0"})
        assert not finished["duplicate"] and "borrowing" in finished, finished
        assert not c.control.training
        again = await c.admin("/train_finished", {"step": 0, "request_id": "step-0"})
        assert again["duplicate"] and again["borrowing"] == finished["borrowing"]


async def test_the_same_request_id_with_another_body_is_refused(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        await c.admin("/train_begin", {"step": 0, "request_id": "a"})
        err = await c.admin("/train_begin", {"step": 1, "request_id": "a"}, expect=409)
        assert err["error"]["type"] == "request_id_reused" and "step" in err["error"]["message"]
        assert c.control.last_step["begin"] == 0
        await c.admin("/train_finished", {"step": 0})
        await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"], "request_id": "j"})
        err = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p2:0"], "request_id": "j"}, expect=409)
        assert err["error"]["type"] == "request_id_reused"
        assert "p2:0" not in c.table.dedicated_gpus
