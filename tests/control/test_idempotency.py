"""Retried admin calls act once, per operation: a request id names one call of one endpoint."""
from __future__ import annotations

import asyncio

import pytest

from pearl_sglang.control.idempotency import OnceByRequestId
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


async def test_a_retry_after_the_first_call_timed_out_waits_for_it_and_acts_once(tiny_model_dir):
    """The router answers 504 when a call outlives its ``deadline_s`` but the call goes on.
    A client retrying with the same id must get that call's answer, not act again: a GPU
    leave applied by the first call and retried was refused as 'GPUs not in the dedicated
    zone' (seen in an elastic replay)."""
    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        timed_out = await c.admin("/train_begin", {"step": 0, "request_id": "s0", "deadline_s": 1e-6},
                                  expect=504)
        assert timed_out["error"]["type"] == "deadline_exceeded", timed_out
        again = await c.admin("/train_begin", {"step": 0, "request_id": "s0", "deadline_s": 60})
        assert again["duplicate"], again
        assert c.control.training and c.control.last_step["begin"] == 0


async def test_a_waiter_that_leaves_does_not_make_the_call_forgettable():
    once, calls, release = OnceByRequestId(), [], asyncio.Event()

    async def act() -> dict:
        calls.append(1)
        await release.wait()
        return {"ok": True}

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(once.run("gpus_leave", "r1", {"gpus": ["a:0"]}, act), 0.01)
    retry = asyncio.ensure_future(once.run("gpus_leave", "r1", {"gpus": ["a:0"]}, act))
    await asyncio.sleep(0.01)
    release.set()
    assert await retry == {"ok": True, "duplicate": True} and calls == [1]

    async def fail() -> dict:
        calls.append(2)
        raise RuntimeError("worker refused")

    with pytest.raises(RuntimeError):
        await once.run("gpus_leave", "r2", {}, fail)
    with pytest.raises(RuntimeError):
        await once.run("gpus_leave", "r2", {}, fail)
    assert calls == [1, 2, 2]  # a failed call is forgotten: its retry acts
