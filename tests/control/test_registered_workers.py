"""Engines launched outside PEARL and registered through the worker API, under PEARL's
policy: prefill <-> decode switches through /pd_role_switch, borrowing and return through
memory release/resume on the overlap zone, with requests completing across both; changes
that would need a relaunch are held out and /pearl/state says so."""
from __future__ import annotations

import asyncio

import httpx

from pearl_sglang.control.processes import free_port
from pearl_sglang.core.registered import is_registered
from pearl_sglang.core.state import Activity, Role, Zone
from tests.control.conftest import AUTH, TOKEN, cluster_config, running_cluster
from tests.support.emulated import emulator

SWITCHABLE = ("--enable-pd-role-switch", "--time-scale", "5")


async def _register(h: httpx.AsyncClient, base: str, url: str, worker_type: str, **extra) -> None:
    params = {"url": url, "worker_type": worker_type, **extra}
    r = await h.post(base + "/add_worker", params=params)
    assert r.status_code == 200, r.text


def _registered_roles(c) -> dict[str, Role]:
    return {w.endpoint: w.role for w in c.table.rollout_workers() if is_registered(w)}


async def _traffic(c, stop: asyncio.Event, results: list) -> None:
    i = 0
    while not stop.is_set():
        batch = [asyncio.ensure_future(c.generate([i, j, 3, 4], n=60)) for j in range(3)]
        results.extend(await asyncio.gather(*batch))
        i += 1


async def test_prefill_decode_switches_on_registered_engines_with_requests_completing(tiny_model_dir):
    ports = [free_port(), free_port(), free_port()]
    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0, pd_mode="auto", time_scale=5)
    async with emulator("--disaggregation-mode", "prefill", *SWITCHABLE, bootstrap_port=ports[0]) as (p1, _), \
            emulator("--disaggregation-mode", "prefill", *SWITCHABLE, bootstrap_port=ports[1]) as (p2, _), \
            emulator("--disaggregation-mode", "decode", *SWITCHABLE, bootstrap_port=ports[2]) as (d1, _):
        async with running_cluster(config, settle_s=30) as c, httpx.AsyncClient(timeout=120, headers=AUTH) as h:
            await _register(h, c.url, p1, "prefill", bootstrap_port=ports[0])
            await _register(h, c.url, p2, "prefill", bootstrap_port=ports[1])
            await _register(h, c.url, d1, "decode")
            state = (await h.get(c.url + "/pearl/state")).json()["registered"]
            assert state["mode_lock"]["pd_mode"] == "disaggregated" and state["excluded_changes"]
            before = _registered_roles(c)
            assert sorted(r.value for r in before.values()) == ["decode", "prefill", "prefill"]

            stop, results = asyncio.Event(), []
            traffic = asyncio.ensure_future(_traffic(c, stop, results))
            await asyncio.sleep(0.5)
            await c.admin("/pearl/pd_mode", {"pd_mode": "1:2"})
            await c.settle()
            middle = _registered_roles(c)
            to_decode = [u for u in before if before[u] is Role.PREFILL and middle[u] is Role.DECODE]
            assert to_decode, (before, middle)
            await c.admin("/pearl/pd_mode", {"pd_mode": "2:1"})
            await c.settle()
            after = _registered_roles(c)
            to_prefill = [u for u in middle if middle[u] is Role.DECODE and after[u] is Role.PREFILL]
            assert to_prefill, (middle, after)
            stop.set()
            await traffic
            assert results and all(len(r["output_ids"]) == 60 for r in results)
            # The engines really changed role, in place: same URLs, the role they report.
            async with httpx.AsyncClient() as raw:
                for url, role in after.items():
                    info = (await raw.get(url + "/model_info")).json()
                    assert info["disaggregation_mode"] == role.value
            decisions = c.control.decisions
            assert all(d.get("mode_lock", {}).get("pd_mode") == "disaggregated" for d in decisions
                       if d["operation"] != "bootstrap" and "mode_lock" in d)
            assert all(not c.table.worker(s).zone is Zone.OVERLAP for s in state["slots"])


async def test_a_switch_waits_for_the_engine_to_be_idle_after_the_routers_drain(tiny_model_dir):
    """The router's drain clears only what PEARL routed; SGLang's prefill may still hold a
    moved request (until its KV sender learns the decode gave it up) and refuses
    /pd_role_switch as "not idle" until then. Here each prefill holds a request PEARL never
    saw, waiting for a decode that never comes, until it is aborted a second later."""
    ports = [free_port(), free_port(), free_port()]
    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0, pd_mode="auto", time_scale=5)
    async with emulator("--disaggregation-mode", "prefill", *SWITCHABLE, bootstrap_port=ports[0]) as (p1, _), \
            emulator("--disaggregation-mode", "prefill", *SWITCHABLE, bootstrap_port=ports[1]) as (p2, _), \
            emulator("--disaggregation-mode", "decode", *SWITCHABLE, bootstrap_port=ports[2]) as (d1, _):
        async with running_cluster(config, settle_s=30) as c, httpx.AsyncClient(timeout=120, headers=AUTH) as h:
            await _register(h, c.url, p1, "prefill", bootstrap_port=ports[0])
            await _register(h, c.url, p2, "prefill", bootstrap_port=ports[1])
            await _register(h, c.url, d1, "decode")
            lingering = [asyncio.ensure_future(h.post(url + "/generate", json={
                "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}, "rid": f"lingering-{i}",
                "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 7 + i}))
                for i, (url, port) in enumerate(((p1, ports[0]), (p2, ports[1])))]
            await asyncio.sleep(0.3)

            async def abort_later() -> None:
                await asyncio.sleep(1.0)
                for i, url in enumerate((p1, p2)):
                    await h.post(url + "/abort_request", json={"rid": f"lingering-{i}"})

            aborting = asyncio.ensure_future(abort_later())
            await c.admin("/pearl/pd_mode", {"pd_mode": "1:2"})
            await c.settle()
            await aborting
            await asyncio.gather(*lingering)
            roles = _registered_roles(c)
            assert sorted(r.value for r in roles.values()) == ["decode", "decode", "prefill"], roles
            out = await c.generate([4, 5, 6], n=8)
            assert len(out["output_ids"]) == 8


async def test_borrow_and_return_of_a_registered_engine_on_training_gpus(tiny_model_dir):
    from pearl_rl_adapter import AsyncPearlClient

    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0, pd_mode="auto", time_scale=5)
    async with emulator("--enable-memory-saver", "--time-scale", "1") as (o1, worker):
        async with running_cluster(config, settle_s=30) as c, httpx.AsyncClient(timeout=120, headers=AUTH) as h:
            r = await h.post(c.url + "/workers", json={"url": o1, "pearl": {"zone": "overlap"}})
            assert r.status_code == 202
            worker_id = r.json()["worker_id"]
            for _ in range(200):
                job = (await h.get(f"{c.url}/workers/{worker_id}")).json()
                if job.get("job_status", {}).get("status") != "processing":
                    break
                await asyncio.sleep(0.05)
            assert job["job_status"]["status"] == "completed", job
            slot = job["pearl"]["slot"]
            w = c.table.worker(slot)
            # Training owns its GPUs: a retained process with its memory given back.
            assert (w.zone, w.activity) == (Zone.OVERLAP, Activity.INACTIVE)
            assert worker.engine._released  # noqa: SLF001 - the emulator's memory state
            assert job["pearl"]["capabilities"]["memory_saver"] is True

            async with AsyncPearlClient(c.url, admin_token=TOKEN) as pearl:
                await pearl.train_begin(0)
                await pearl.train_finished(0)  # PEARL borrows the training GPUs
                await c.settle()
                assert c.table.worker(slot).activity is Activity.ACTIVE
                assert not worker.engine._released  # noqa: SLF001
                busy = [asyncio.ensure_future(c.generate([i, 2, 3], n=300)) for i in range(6)]
                for _ in range(500):  # the borrowed engine serves some of them
                    if c.app[ROUTER_KEY].inflight.load().get(slot, 0) >= 1:
                        break
                    await asyncio.sleep(0.01)
                assert c.app[ROUTER_KEY].inflight.load().get(slot, 0) >= 1
                async with pearl.training_step(1):
                    assert c.table.worker(slot).activity is Activity.INACTIVE
                    assert worker.engine._released  # noqa: SLF001
                outs = await asyncio.gather(*busy)
                assert all(len(o["output_ids"]) == 300 for o in outs)
                await c.settle()
                assert c.table.worker(slot).activity is Activity.ACTIVE  # borrowed again


async def _job(h: httpx.AsyncClient, base: str, worker_id: str) -> dict:
    for _ in range(400):
        job = (await h.get(f"{base}/workers/{worker_id}")).json()
        if job.get("job_status", {}).get("status") != "processing":
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"registration of {worker_id} did not finish")


async def test_an_engine_that_says_it_has_no_memory_saver_is_refused_on_training_gpus_despite_the_claim(
        tiny_model_dir):
    """Without the memory saver SGLang answers a release with success and frees nothing:
    the engine's own report outranks a registration that claims the memory saver, so the
    training GPUs are never handed back still full."""
    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0, time_scale=5)
    async with emulator("--time-scale", "1") as (url, worker):
        async with running_cluster(config, settle_s=30) as c, httpx.AsyncClient(timeout=120, headers=AUTH) as h:
            for claim in (None, True):
                r = await h.post(c.url + "/workers", json={"url": url, "pearl": {"zone": "overlap",
                                                                                  "memory_saver": claim}})
                assert r.status_code == 202, r.text
                job = await _job(h, c.url, r.json()["worker_id"])
                assert job["job_status"]["status"] == "failed", job
                message = job["job_status"]["message"]
                assert "enable_memory_saver: false" in message and "--enable-memory-saver" in message, message
                assert not [w for w in c.table.rollout_workers() if is_registered(w)]
            assert not worker.engine._released  # noqa: SLF001 - never told to give memory back
            r = await h.post(c.url + "/add_worker", params={"url": url})
            assert r.status_code == 200, r.text  # the same engine is welcome on dedicated GPUs


from pearl_sglang.router.state import ROUTER as ROUTER_KEY  # noqa: E402
