"""AReaL v1.0.4's rollout-path calls (tests/adapter/framework_calls.py), made in order
against PEARL as AReaL's one server address, over emulated engines behind it.

AReaL sends its pause, weight update and continue to the same address as ``/generate``;
PEARL answers them as PEARL-level operations (pearl_sglang/server/engine_control_routes.py):
the pause aborts the requests in flight (each returns its partial output, which AReaL
resubmits after the pause) and holds new ones, the weight update goes through the control
plane to every worker, and the resubmission runs on the new weights."""
from __future__ import annotations

import asyncio

import httpx

from pearl_sglang.router.state import ROUTER
from benchmarks.harness.cluster import running_cluster
from tests.adapter import framework_calls as fc
from tests.adapter.test_framework_calls import Replay, _gen, _running
from tests.control.conftest import cluster_config

BUDGET = 400


async def test_areal_calls_against_pearl(tiny_model_dir, tiny_model_variant_dir):
    health, generate, pause, update, resume, generate2 = fc.AREAL_CALLS
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=0, time_scale=1)
    async with running_cluster(config, token=None) as c, httpx.AsyncClient(timeout=120) as client:
        rp = Replay(client, c.url)
        rp.app = c.app
        await rp.call(health)
        bodies = [_gen(i, BUDGET) for i in range(3)]
        pending = [asyncio.ensure_future(rp.call(generate, json=b)) for b in bodies]
        await _running(rp)
        await asyncio.sleep(0.2)
        await rp.call(pause, json={})
        outs = [(await p).json() for p in pending]
        assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
        assert all(len(o["output_ids"]) < BUDGET for o in outs)
        # Held while paused: a request sent now waits for the continue.
        held = asyncio.ensure_future(client.post(c.url + "/generate", json=_gen(9, 4)))
        await asyncio.sleep(0.3)
        assert not held.done() and c.app[ROUTER].gate.waiting == 1
        r = await rp.call(update, json={"model_path": str(tiny_model_variant_dir), "abort_all_requests": True})
        assert r.json()["success"] is True
        await rp.call(resume, json={})
        assert (await held).status_code == 200
        # AReaL's resubmission: prompt + partial output, the remaining budget (remote_inf_engine.py:908).
        again = []
        for body, out in zip(bodies, outs):
            left = BUDGET - len(out["output_ids"])
            again.append(asyncio.ensure_future(rp.call(generate2, json={
                **body, "input_ids": body["input_ids"] + out["output_ids"],
                "sampling_params": {**body["sampling_params"], "max_new_tokens": left}})))
        for out, p in zip(outs, again):
            done = (await p).json()
            assert done["meta_info"]["finish_reason"]["type"] == "length"
            assert len(out["output_ids"]) + len(done["output_ids"]) == BUDGET
            assert done["meta_info"]["weight_version"] == str(tiny_model_variant_dir)
        rp.check(fc.AREAL_CALLS)


async def test_pause_modes_other_than_abort_are_refused(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0)
    async with running_cluster(config, token=None) as c, httpx.AsyncClient(timeout=60) as client:
        r = await client.post(c.url + "/pause_generation", json={"mode": "retract"})
        assert r.status_code == 400 and "retract" in r.json()["error"]["message"]
        r = await client.post(c.url + "/update_weights_from_disk", json={"abort_all_requests": True})
        assert r.status_code == 400 and "model_path" in r.json()["error"]["message"]
        # A checkpoint no worker can load is a failure, as SGLang answers it (it was once a 200).
        r = await client.post(c.url + "/update_weights_from_disk", json={"model_path": "/no/such/checkpoint"})
        assert r.status_code == 400 and r.json()["success"] is False, r.text
        assert r.json()["pearl"]["applied"] is False and "/no/such/checkpoint" in r.json()["message"]
        assert c.app[ROUTER].gate.is_open
