"""sglang-router's worker API on PEARL's router, over emulated workers in this event loop:
registration (health-checked, weight-synced, admitted atomically), PD registration with
bootstrap ports, removal with drain and partial output kept, the legacy calls, bad input
and the admin token."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from pearl_sglang.control.attach import attached_table
from pearl_sglang.control.processes import free_port
from pearl_sglang.control.registration import Registrar, WeightSyncFailed, WorkerNotReady, WorkerSpec
from pearl_sglang.core.weight_snapshot import WeightSnapshot
from pearl_sglang.core.registered import RegistrationConfig
from pearl_sglang.core.state import Activity, Role
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.state import ROUTER
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import WorkerClient
from tests.router.conftest import ADMIN_TOKEN, running_router
from tests.support.emulated import emulator
from tests.support.router_process import wait_answering

FAST = ("--time-scale", "20")
SLOW = ("--time-scale", "1")
HEALTH_INTERVAL_S = 2.0


def _config(**kw) -> RouterConfig:
    return RouterConfig(security=Security(admin_token=kw.pop("admin_token", None)),
                        health_interval_s=HEALTH_INTERVAL_S,
                        registration=RegistrationConfig(startup_timeout_s=kw.pop("startup_timeout_s", 30.0),
                                                        poll_interval_s=0.2), **kw)


def _gen(n=4, prompt=(1, 2, 3, 4)):
    return {"input_ids": list(prompt), "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}


async def _job_done(c, base, worker_id, timeout=20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        r = await c.get(f"{base}/workers/{worker_id}")
        if r.status_code == 200 and r.json().get("job_status", {}).get("status") in ("completed", "failed"):
            return r.json()
        await asyncio.sleep(0.05)
    raise AssertionError(f"job of {worker_id} did not finish")


async def test_added_worker_serves_within_one_health_interval_and_removed_one_stops():
    async with emulator(*FAST) as (u0, w0), emulator(*FAST) as (u1, w1):
        async with running_router(regular=[u0], config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                r = await c.post(base + "/workers", json={"url": u1})
                assert r.status_code == 202, r.text
                body = r.json()
                assert body["status"] == "accepted" and body["url"] == u1
                assert r.headers["Location"] == body["location"] == f"/workers/{body['worker_id']}"
                job = await _job_done(c, base, body["worker_id"])
                admitted_after = loop.time() - t0
                assert job["job_status"]["status"] == "completed", job
                assert job["is_healthy"] and job["worker_type"] == "regular"
                assert admitted_after < HEALTH_INTERVAL_S

                listed = (await c.get(base + "/workers")).json()
                assert listed["total"] == 2 and listed["stats"]["regular_count"] == 2
                assert {w["url"] for w in listed["workers"]} == {u0, u1}
                old_id = next(w["id"] for w in listed["workers"] if w["url"] == u0)

                r = await c.delete(f"{base}/workers/{old_id}")
                assert r.status_code == 202 and r.json()["worker_id"] == old_id
                await _job_done(c, base, old_id)
                assert [w.endpoint for w in store.table.active()] == [u1]
                out = (await c.post(base + "/generate", json=_gen())).json()
                assert out["meta_info"]["finish_reason"]["type"] == "length"
                assert (await c.delete(f"{base}/workers/{old_id}")).status_code == 404


async def test_pd_workers_register_with_bootstrap_port_and_serve_once_paired():
    port = free_port()
    async with emulator("--disaggregation-mode", "prefill", *FAST, bootstrap_port=port) as (up, _), \
            emulator("--disaggregation-mode", "decode", *FAST) as (ud, _):
        async with running_router(config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(base + "/workers", json={"url": up, "worker_type": "prefill", "bootstrap_port": port})
                job = await _job_done(c, base, r.json()["worker_id"])
                assert job["worker_type"] == "prefill" and job["bootstrap_port"] == port
                # A lone prefill worker is held out of routing until a decode worker joins.
                assert not job["is_healthy"] and job["pearl"]["activity"] == "switching"
                r = await c.post(base + "/workers", json={"url": ud, "worker_type": "decode"})
                await _job_done(c, base, r.json()["worker_id"])
                listed = (await c.get(base + "/workers")).json()
                assert listed["stats"] == {"prefill_count": 1, "decode_count": 1, "regular_count": 0}
                assert all(w["is_healthy"] for w in listed["workers"])
                assert store.table.active_topology().label() == "1P1D"
                out = (await c.post(base + "/generate", json=_gen(6))).json()
                assert len(out["output_ids"]) == 6


async def test_removal_drains_in_flight_requests_with_their_partial_output():
    async with emulator(*SLOW) as (u0, w0), emulator(*SLOW) as (u1, _):
        async with running_router(regular=[u0], config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=60) as c:
                r = await c.post(f"{base}/add_worker", params={"url": u1})
                assert r.status_code == 200 and r.text == f"Successfully added worker: {u1}"
                pending = [asyncio.ensure_future(c.post(base + "/generate", json=_gen(300, (7, i, 9))))
                           for i in range(4)]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while w0.engine.loads().num_running_reqs < 1 and loop.time() < deadline:
                    await asyncio.sleep(0.01)
                assert w0.engine.loads().num_running_reqs >= 1
                r = await c.post(f"{base}/remove_worker", params={"url": u0})
                assert r.status_code == 200 and r.text == f"Successfully removed worker: {u0}"
                assert (await c.get(base + "/list_workers")).json() == {"urls": [u1]}
                outs = [(await p).json() for p in pending]
                assert all(len(o["output_ids"]) == 300 for o in outs)
                assert app[ROUTER].dispatcher.migrations >= 1


async def test_bad_input_answers_like_sglang_router():
    async with emulator(*FAST) as (u0, _):
        async with running_router(regular=[u0], config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                assert (await c.post(base + "/workers", json={})).status_code == 422
                assert (await c.post(base + "/workers", json={"url": 5})).status_code == 422
                assert (await c.post(base + "/workers", json={"url": u0, "worker_type": "bogus"})).status_code == 422
                r = await c.post(base + "/workers", content=b'{"url": "http://127.0.0.1:1"}')
                assert r.status_code == 415
                r = await c.post(base + "/workers", content=b"nojson", headers={"Content-Type": "application/json"})
                assert r.status_code == 400
                r = await c.get(base + "/workers/not-a-uuid")
                assert r.status_code == 400 and r.json()["code"] == "BAD_REQUEST"
                r = await c.get(base + "/workers/00000000-0000-0000-0000-000000000000")
                assert r.status_code == 404 and r.json() == {
                    "error": "Worker 00000000-0000-0000-0000-000000000000 not found", "code": "WORKER_NOT_FOUND"}
                r = await c.post(base + "/workers", json={"url": "http://example.com:30000"})
                assert r.status_code == 400 and "allowed-worker-hosts" in r.text
                assert (await c.post(base + "/add_worker")).status_code == 422
                r = await c.post(base + "/remove_worker", params={"url": "http://127.0.0.1:1"})
                assert r.status_code == 400


@pytest.mark.parametrize("body,fragment", [
    ({"worker_type": ["prefill"]}, "worker_type"),
    ({"worker_type": {"prefill": 1}}, "worker_type"),
    ({"pearl": {"zone": ["elastic"]}}, "pearl.zone"),
    ({"pearl": {"zone": {}}}, "pearl.zone"),
    ({"worker_type": "prefill", "bootstrap_port": "\u00b2"}, "bootstrap_port"),
    ({"url": "http://[::1"}, "malformed"),
    ({"url": "http://127.0.0.1:99999"}, "malformed"),
    ({"url": "http://"}, "no host"),
])
async def test_malformed_registrations_are_4xx_not_500(body, fragment):
    """Found by the malformed-request fuzz: each of these was a 500."""
    dead = "http://127.0.0.1:9"
    async with running_router(regular=[dead], config=_config()) as (base, _, _):
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(base + "/workers", json={"url": dead, **body})
            assert r.status_code in (400, 422) and fragment in r.text, r.text
            legacy = {k: v for k, v in {"url": dead, **body}.items() if isinstance(v, str)}
            if "bootstrap_port" in body or "url" in body:
                r = await c.post(base + "/add_worker", params=legacy)
                assert r.status_code in (400, 422) and fragment in r.text, r.text


async def test_worker_that_never_turns_healthy_is_not_admitted():
    dead = f"http://127.0.0.1:{free_port()}"
    async with emulator(*FAST) as (u0, _):
        async with running_router(regular=[u0], config=_config(startup_timeout_s=1.0)) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(base + "/workers", json={"url": dead})
                job = await _job_done(c, base, r.json()["worker_id"])
                assert job["job_status"]["status"] == "failed"
                assert "did not become healthy" in job["job_status"]["message"]
                assert [w.endpoint for w in store.table.rollout_workers()] == [u0]
                r = await c.post(f"{base}/add_worker", params={"url": dead})
                assert r.status_code == 400 and "did not become healthy" in r.text


async def test_worker_api_needs_the_admin_token_when_one_is_set():
    async with emulator(*FAST) as (u0, _):
        async with running_router(regular=[u0], config=_config(admin_token=ADMIN_TOKEN)) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                for method, path in (("GET", "/workers"), ("POST", "/workers"), ("GET", "/list_workers"),
                                     ("POST", "/add_worker?url=" + u0), ("POST", "/remove_worker?url=" + u0)):
                    assert (await c.request(method, base + path)).status_code == 401, path
                r = await c.get(base + "/workers", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert r.status_code == 200 and r.json()["total"] == 1
        async with running_router(regular=[u0], config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                assert (await c.get(base + "/workers")).status_code == 200


async def test_registered_worker_is_synced_to_the_latest_snapshot_before_admission(tiny_model_dir):
    async with emulator(*FAST) as (u0, w0), emulator(*FAST, "--weight-version", "v0") as (u1, w1):
        import aiohttp

        async with aiohttp.ClientSession() as session:
            store = StateStore(attached_table(regular=(u0,)))
            ops = WorkerClient(session)
            snapshot = WeightSnapshot(version="v7", model_path=str(tiny_model_dir))

            async def drain(slot, timeout_s):
                return True

            registrar = Registrar(store=store, ops=ops, snapshot=lambda: snapshot, drain=drain,
                                  config=RegistrationConfig(startup_timeout_s=5, poll_interval_s=0.1))
            record = await registrar.add(WorkerSpec(url=u1))
            assert record.weight_version == "v7" and record.activity is Activity.ACTIVE
            assert (await ops.model_info(u1))["weight_version"] == "v7"

            broadcast_only = WeightSnapshot(version="v8", group="g")
            registrar.snapshot = lambda: broadcast_only
            await registrar.remove(u1)
            try:
                await registrar.add(WorkerSpec(url=u1))
            except WeightSyncFailed as e:
                assert "v8" in str(e)
            else:
                raise AssertionError("a worker that cannot load the latest weights was admitted")
            assert [w.endpoint for w in store.table.rollout_workers()] == [u0]
            registrar.config = replace(registrar.config, startup_timeout_s=0.3)
            try:
                await registrar.add(WorkerSpec(url=f"http://127.0.0.1:{free_port()}", role=Role.DECODE))
            except WorkerNotReady:
                pass
            else:
                raise AssertionError("an unreachable worker was admitted")


async def test_workers_can_be_named_by_their_encoded_url():
    from urllib.parse import quote

    async with emulator(*FAST) as (u0, _), emulator(*FAST) as (u1, _):
        async with running_router(regular=[u0, u1], config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.get(f"{base}/workers/{quote(u1, safe='')}")
                assert r.status_code == 200 and r.json()["url"] == u1
                r = await c.delete(f"{base}/workers/{quote(u1, safe='')}")
                assert r.status_code == 202
                await _job_done(c, base, r.json()["worker_id"])
                assert [w.endpoint for w in store.table.rollout_workers()] == [u0]
                r = await c.delete(f"{base}/workers/{quote('http://127.0.0.1:1', safe='')}")
                assert r.status_code == 404


async def test_router_started_without_workers_serves_engines_that_register(tmp_path):
    """``python -m pearl_sglang.router`` with no workers, as frameworks start sglang-router."""
    import os
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pearl_sglang.router", "--port", str(port),
                             "--log-level", "WARNING"], env=dict(os.environ), stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        async with emulator(*FAST) as (u0, _), httpx.AsyncClient(timeout=30) as c:
            await wait_answering(c, base + "/workers", proc)
            r = await c.post(f"{base}/add_worker", params={"url": u0})
            assert r.status_code == 200, r.text
            out = (await c.post(base + "/generate", json=_gen(5))).json()
            assert len(out["output_ids"]) == 5
    finally:
        proc.terminate()
        proc.wait(20)
