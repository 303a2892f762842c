"""The worker API with real SGLang 0.5.23 servers on CPU started outside PEARL: a
colocated engine and a prefill/decode pair register through the API, serve and leave;
ROLL v0.3.0's router calls run against them."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from pearl_sglang.core.registered import RegistrationConfig
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.state import ROUTER
from tests.adapter.test_framework_calls import Replay, roll_step
from tests.router.conftest import running_router

pytestmark = pytest.mark.realsglang

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def real(worker_sets):
    return worker_sets("sglang")


def _config() -> RouterConfig:
    return RouterConfig(security=Security(), health_interval_s=2.0,
                        registration=RegistrationConfig(startup_timeout_s=120, poll_interval_s=0.5))


async def _admitted(c, base, worker_id, timeout=180.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        job = (await c.get(f"{base}/workers/{worker_id}")).json()
        if job.get("job_status", {}).get("status") != "processing":
            assert job["job_status"]["status"] == "completed", job
            return job
        await asyncio.sleep(0.2)
    raise AssertionError("admission did not finish")


async def test_real_engines_register_serve_and_leave(real):
    worker, pair = real
    async with running_router(config=_config()) as (base, app, store), httpx.AsyncClient(timeout=300) as c:
        r = await c.post(base + "/workers", json={"url": worker.url})
        job = await _admitted(c, base, r.json()["worker_id"])
        assert job["is_healthy"] and job["model_id"] != "unknown"
        out = (await c.post(base + "/generate", json={"input_ids": [1, 2, 3, 4], "sampling_params": GREEDY})).json()
        assert len(out["output_ids"]) == 8
        r = await c.delete(f"{base}/workers/{job['id']}")
        assert r.status_code == 202
        await _admitted(c, base, job["id"])
        assert not store.table.rollout_workers()

        for url, kind, port in ((pair.prefill_url, "prefill", pair.prefill_bootstrap_port),
                                (pair.decode_url, "decode", None)):
            r = await c.post(base + "/workers", json={"url": url, "worker_type": kind, "bootstrap_port": port})
            await _admitted(c, base, r.json()["worker_id"])
        listed = (await c.get(base + "/workers")).json()
        assert listed["stats"] == {"prefill_count": 1, "decode_count": 1, "regular_count": 0}
        assert store.table.active_topology().label() == "1P1D"
        out = (await c.post(base + "/generate", json={"input_ids": [5, 6, 7], "sampling_params": GREEDY})).json()
        assert len(out["output_ids"]) == 8
        for w in listed["workers"]:
            await c.delete(f"{base}/workers/{w['id']}")


@pytest.mark.timeout(900)  # four 300-token requests on one CPU engine, moved once
async def test_roll_router_calls_against_a_real_engine(real):
    """ROLL v0.3.0's calls over one real engine: its shrink removes the engine PEARL routes
    to and registers it again while requests are in flight, so PEARL moves them back onto
    the same engine (under fresh worker-side rids, which SGLang does not abort)."""
    worker, _ = real
    async with running_router(regular=[worker.url], config=_config()) as (base, app, store):
        async with httpx.AsyncClient(timeout=300) as c:
            rp = Replay(c, base)
            rp.app = app
            await roll_step(rp, [worker.url])
            assert app[ROUTER].dispatcher.migrations >= 1
