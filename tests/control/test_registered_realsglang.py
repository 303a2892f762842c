"""Real SGLang 0.5.23 engines on CPU that PEARL did not start, as an RL framework starts
its own, registered through sglang-router's worker API and put under PEARL's policy:
prefill <-> decode switches in place (``/pd_role_switch``) with requests in flight,
every output token-exact, and the engines never relaunched or stopped by PEARL; training
GPUs are refused to an engine that cannot free its memory (this CPU build has no memory
saver, so a release would answer success and free nothing).

PEARL's cluster config needs one GPU of its own; the worker PEARL launches there is an
emulated one and leaves before the framework's engines register, so every request below
is served by the real engines alone.
"""
from __future__ import annotations

import asyncio

import httpx
import pytest

from pearl_sglang.control.cluster_config import ClusterConfig
from benchmarks.harness.servers import wait_all_healthy
from pearl_sglang.control.processes import free_port
from pearl_sglang.core.registered import is_registered
from pearl_sglang.core.state import Role
from pearl_sglang.router.state import ROUTER
from tests.control.conftest import AUTH, PROFILE, running_cluster
from tests.support.workers import WorkerLauncher

pytestmark = [pytest.mark.realsglang, pytest.mark.timeout(1800)]

IDS = [5, 10, 15, 20, 25]
LONG = 200  # tokens per in-flight request: long enough to be mid-decode when PEARL switches


@pytest.fixture(scope="module")
def engines(tiny_model_dir, tmp_path_factory):
    """One prefill and two decode engines, each able to switch role, started by the test."""
    launcher = WorkerLauncher("sglang", tmp_path_factory.mktemp("logs-registered"))
    try:
        started = [(launcher.start(name, tiny_model_dir, role, bootstrap_port=port), role, port)
                   for name, role, port in (("reg-prefill", Role.PREFILL, free_port()),
                                            ("reg-decode-a", Role.DECODE, free_port()),
                                            ("reg-decode-b", Role.DECODE, free_port()))]
        wait_all_healthy([s for s, _, _ in started], timeout=900)
        yield started
    finally:
        launcher.stop_all()


def _config(model_dir) -> ClusterConfig:
    return ClusterConfig.from_mapping({
        "engine": {"kind": "emulator", "model_path": str(model_dir), "tp_size": 1,
                   "emulator": {"profile": "tiny", "time_scale": 5}},
        "zones": {"dedicated": ["d0:0"], "overlap": []},
        "profile": PROFILE, "pd_mode": "disaggregated", "gate": {"enabled": False},
        "deadlines": {"leave_s": 120, "drain_s": 90},
    })


async def _generate(h: httpx.AsyncClient, base: str, n: int) -> dict:
    r = await h.post(base + "/generate", json={
        "input_ids": IDS, "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()


async def _registered(h: httpx.AsyncClient, base: str, worker_id: str) -> dict:
    for _ in range(3000):
        job = (await h.get(f"{base}/workers/{worker_id}")).json()
        if job.get("job_status", {}).get("status") != "processing":
            return job
        await asyncio.sleep(0.2)
    raise AssertionError(f"registration of {worker_id} did not finish")


def _roles(c) -> dict[str, Role]:
    return {w.endpoint: w.role for w in c.table.rollout_workers() if is_registered(w)}


async def _reported_role(h: httpx.AsyncClient, url: str) -> str:
    return (await h.get(url + "/model_info")).json()["disaggregation_mode"]


async def _switch_with_requests_in_flight(c, h, ratio: str, busy_role: Role) -> tuple[dict, list[dict]]:
    """Start requests, wait until every worker of ``busy_role`` serves one, then set the
    P:D ratio; returns the roles after the switch and the requests' answers."""
    flood = [asyncio.ensure_future(_generate(h, c.url, LONG)) for _ in range(3)]
    busy = {w.slot for w in c.table.active(busy_role)}
    inflight = c.app[ROUTER].inflight
    for _ in range(3000):
        if all(inflight.load().get(s, 0) >= 1 for s in busy):
            break
        await asyncio.sleep(0.05)
    assert all(inflight.load().get(s, 0) >= 1 for s in busy), inflight.load()
    await c.admin("/pearl/pd_mode", {"pd_mode": ratio}, timeout=900)
    await c.settle(900)
    return _roles(c), list(await asyncio.gather(*flood))


async def test_training_gpus_are_refused_to_a_real_engine_without_the_memory_saver(engines, tiny_model_dir):
    """The only honest answer on this machine: the CPU build cannot run the memory saver
    (torch-memory-saver needs libcuda.so.1), so an engine registered for the overlap zone
    is refused with the reason, even when the registration claims the memory saver, and
    PEARL never asks it to release memory it would not free."""
    server, _, port = engines[0]
    async with running_cluster(_config(tiny_model_dir), settle_s=60) as c, \
            httpx.AsyncClient(timeout=900, headers=AUTH) as h:
        info = (await h.get(server.url + "/server_info")).json()
        assert info["enable_memory_saver"] is False
        for claim in (None, True):
            r = await h.post(c.url + "/workers", json={
                "url": server.url, "worker_type": "prefill", "bootstrap_port": port,
                "pearl": {"zone": "overlap", "memory_saver": claim}})
            assert r.status_code == 202, r.text
            job = await _registered(h, c.url, r.json()["worker_id"])
            assert job["job_status"]["status"] == "failed", job
            assert "enable_memory_saver: false" in job["job_status"]["message"], job
        assert not [w for w in c.table.rollout_workers() if is_registered(w)]
        assert (await h.get(server.url + "/health")).status_code == 200


async def test_prefill_decode_switches_in_place_on_registered_real_engines(engines, tiny_model_dir):
    pids = [s.pid for s, _, _ in engines]
    async with running_cluster(_config(tiny_model_dir), settle_s=60) as c, \
            httpx.AsyncClient(timeout=900, headers=AUTH) as h:
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": ["d0:0"], "deadline_s": 30})
        await c.settle()
        assert not c.table.rollout_workers()
        launches = c.launcher.launches
        for server, role, port in engines:
            r = await h.post(c.url + "/workers", json={"url": server.url, "worker_type": role.value,
                                                       "bootstrap_port": port})
            assert r.status_code == 202, r.text
            job = await _registered(h, c.url, r.json()["worker_id"])
            assert job["job_status"]["status"] == "completed", job
        before = _roles(c)
        assert sorted(r.value for r in before.values()) == ["decode", "decode", "prefill"]
        state = (await h.get(c.url + "/pearl/state")).json()["registered"]
        assert state["mode_lock"]["pd_mode"] == "disaggregated" and state["excluded_changes"]
        expected = (await _generate(h, c.url, LONG))["output_ids"]
        assert len(expected) == LONG
        migrations = c.app[ROUTER].dispatcher.migrations

        # 1P2D -> 2P1D: a decode engine becomes a prefill engine while it decodes.
        middle, outs = await _switch_with_requests_in_flight(c, h, "2:1", Role.DECODE)
        to_prefill = [u for u in before if before[u] is Role.DECODE and middle[u] is Role.PREFILL]
        assert len(to_prefill) == 1, (before, middle)
        assert [o["output_ids"] for o in outs] == [expected] * 3
        assert c.app[ROUTER].dispatcher.migrations > migrations  # its requests moved, output kept
        assert await _reported_role(h, to_prefill[0]) == "prefill"
        assert (await _generate(h, c.url, LONG))["output_ids"] == expected

        # 2P1D -> 1P2D: a prefill engine becomes a decode engine, requests in flight.
        after, outs = await _switch_with_requests_in_flight(c, h, "1:2", Role.DECODE)
        to_decode = [u for u in middle if middle[u] is Role.PREFILL and after[u] is Role.DECODE]
        assert len(to_decode) == 1, (middle, after)
        assert [o["output_ids"] for o in outs] == [expected] * 3
        assert await _reported_role(h, to_decode[0]) == "decode"
        assert (await _generate(h, c.url, LONG))["output_ids"] == expected

        # Every switch was made in place: PEARL launched nothing, the engines kept their processes.
        assert c.launcher.launches == launches
        assert [s.pid for s, _, _ in engines] == pids and all(s.alive() for s, _, _ in engines)
        decisions = [d for d in c.control.decisions if d["operation"] == "pd_mode"]
        assert len(decisions) == 2
    # PEARL's shutdown leaves the framework's engines running.
    assert all(s.alive() for s, _, _ in engines)
    async with httpx.AsyncClient(timeout=60) as raw:
        for server, _, _ in engines:
            assert (await raw.get(server.url + "/health")).status_code == 200
