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


def _held_call():
    """An admin call's work that runs until ``release`` is set; ``calls`` counts its runs."""
    calls, release = [], asyncio.Event()

    async def act() -> dict:
        calls.append(1)
        await release.wait()
        return {"ok": True}
    return calls, release, act


async def test_a_waiter_that_leaves_does_not_make_the_call_forgettable():
    once, (calls, release, act) = OnceByRequestId(), _held_call()

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


async def test_a_train_begin_without_a_request_id_goes_on_after_its_504(tiny_model_dir):
    """Found by fuzzing: the 504 cancelled the call itself, half-way through returning the
    training GPUs; the step counted as begun while borrowed workers went on serving (or
    stayed leaving for good), and both a retry and train_finished were 409s."""
    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        await c.admin("/train_begin", {"step": 0})
        assert (await c.admin("/train_finished", {"step": 0}))["borrowing"]
        for _ in range(400):  # the borrowed workers serve
            if c.table.active_topology().total == 4:
                break
            await asyncio.sleep(0.05)
        assert c.table.active_topology().total == 4
        await c.admin("/train_begin", {"step": 1, "deadline_s": 1e-6}, expect=504)
        for _ in range(400):
            if c.control.training and c.table.training_owns_overlap:
                break
            await asyncio.sleep(0.05)
        assert c.control.training and c.table.training_owns_overlap, "the train_begin did not go on"
        again = await c.admin("/train_begin", {"step": 1})  # the step has begun: its retry is answered
        assert again["repeated_step"] and again["returned_gpus"] == ["t0:0", "t0:1"]
        finished = await c.admin("/train_finished", {"step": 1})
        assert "borrowing" in finished and not c.control.training


async def test_without_an_id_a_call_goes_on_when_its_caller_stops_and_a_named_run_joins_it():
    once, (calls, release, act) = OnceByRequestId(), _held_call()

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(once.run("train_begin", None, {}, act), 0.01)
    with pytest.raises(asyncio.TimeoutError):  # per step, remembered only while it runs
        await asyncio.wait_for(once.run("train_begin", "step 3", {"step": 3}, act, remember=False), 0.01)
    retry = asyncio.ensure_future(once.run("train_begin", "step 3", {"step": 3}, act, remember=False))
    await asyncio.sleep(0.01)
    release.set()
    assert await retry == {"ok": True, "duplicate": True}
    assert calls == [1, 1]  # the first (no id) went on; the retry joined the second
    assert await once.run("train_begin", "step 3", {"step": 3}, act, remember=False) == {
        "ok": True, "duplicate": False}  # done: forgotten, so a later call acts
    assert calls == [1, 1, 1]
