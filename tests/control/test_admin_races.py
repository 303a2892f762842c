"""Admin calls that race each other all answer: with the outcome, or with an error that
says what happened, never a dropped connection."""
from __future__ import annotations

import asyncio

from tests.control.conftest import cluster_config, running_cluster


def slow_start(tiny_model_dir, **kw):
    # Each new emulated process takes 1 s (20 emulated seconds at time scale 20) to start.
    config = cluster_config(tiny_model_dir, **kw)
    from dataclasses import replace
    return replace(config, engine=replace(config.engine, emulator={**config.engine.emulator, "cold_start": 20}))


async def post(c, path, body):
    r = await c.client.post(c.url + path, json=body, headers=c.auth)
    return r.status_code, r.json()


async def test_pd_mode_preempted_by_train_begin_still_answers(tiny_model_dir):
    async with running_cluster(slow_start(tiny_model_dir, dedicated=3, overlap=2), settle_s=60) as c:
        await c.admin("/train_finished", {"step": -1}, expect=409)
        mode = asyncio.ensure_future(post(c, "/pearl/pd_mode", {"pd_mode": "disaggregated"}))
        await asyncio.sleep(0.05)
        begun = asyncio.ensure_future(post(c, "/train_begin", {"step": 0}))
        (mode_status, mode_body), (begin_status, begin_body) = await asyncio.gather(mode, begun)
        assert begin_status == 200, begin_body
        assert mode_status in (200, 409), mode_body
        if mode_status == 409:
            assert mode_body["error"]["type"] == "preempted", mode_body
        await c.settle(60)
        assert c.table.active_topology().total >= 1


async def test_a_refused_leave_leaves_a_join_in_flight_alone(tiny_model_dir):
    # Found by fuzzing: a leave of GPUs the cluster does not have answered 409, but had
    # already stopped the join in flight (its launching worker killed, nothing re-planned).
    async with running_cluster(slow_start(tiny_model_dir), settle_s=60) as c:
        join = asyncio.ensure_future(post(c, "/pearl/gpus", {"action": "join", "gpus": ["x0:0"]}))
        await asyncio.sleep(0.2)
        status, body = await post(c, "/pearl/gpus", {"action": "leave", "gpus": ["nosuch:0"], "deadline_s": 5})
        assert status == 409 and "dedicated zone" in body["error"]["message"], body
        status, body = await join
        assert status == 200 and not body["cancelled"] and body["admitted"], body
