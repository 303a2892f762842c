"""Credentials and limits: tokens are compared in constant time and never appear in logs,
reprs or answers; worker hosts named through the admin API must match the configured
allow-list; every request limit answers a 4xx whose error type names it."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import fields
from pathlib import Path

import httpx
import pytest

import pearl_sglang.router.middleware as middleware
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.limits import Limits
from tests.control.conftest import AUTH, cluster_config, running_cluster
from tests.faults.support import SLOW, long_body, running, until
from tests.router.conftest import running_router, with_limits
from tests.support.emulated import emulator

ADMIN_SECRET = "adm-5ecret-d0-not-log"
API_SECRET = "api-5ecret-d0-not-log"
REPO = Path(__file__).resolve().parents[2]


def _secure_config() -> RouterConfig:
    return RouterConfig(security=Security(admin_token=ADMIN_SECRET, api_key=API_SECRET), health_interval_s=3600)


async def test_tokens_never_appear_in_logs_reprs_or_answers(caplog):
    config = _secure_config()
    assert ADMIN_SECRET not in repr(config) and API_SECRET not in repr(config)
    assert ADMIN_SECRET not in str(config.security) and API_SECRET not in f"{config}"
    caplog.set_level(logging.DEBUG)
    bodies = []
    async with emulator("--time-scale", "50") as (worker_url, _):
        async with running_router(regular=[worker_url], config=config) as (url, _, _):
            async with httpx.AsyncClient(timeout=30) as c:
                for token in (ADMIN_SECRET, API_SECRET, ADMIN_SECRET[:-1], "wrong"):
                    auth = {"Authorization": f"Bearer {token}"}
                    for r in await asyncio.gather(
                            c.get(url + "/pearl/state", headers=auth),
                            c.post(url + "/generate", headers=auth, json=long_body([1, 2], 4)),
                            c.post(url + "/generate", headers={"X-Api-Key": token}, content=b"{bad"),
                            c.post(url + "/flush_cache", headers=auth),
                            c.get(url + "/server_info", headers=auth),
                            c.get(url + "/metrics")):
                        bodies.append(r.text)
    assert any('"output_ids"' in b for b in bodies)  # the right key did work
    text = caplog.text + "".join(bodies)
    for secret in (ADMIN_SECRET, API_SECRET, ADMIN_SECRET[:-1]):
        assert secret not in text


async def test_credentials_are_compared_in_constant_time(monkeypatch):
    calls = []
    real = middleware.hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return real(a, b)

    monkeypatch.setattr(middleware.hmac, "compare_digest", spy)
    async with running_router(regular=["http://127.0.0.1:9"], config=_secure_config()) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            ok = await c.get(url + "/pearl/state", headers={"Authorization": f"Bearer {ADMIN_SECRET}"})
            bad = await c.get(url + "/pearl/state", headers={"Authorization": "Bearer x"})
            odd = await c.get(url + "/pearl/state", headers={"Authorization": "Bearer \u00e9t\u00e9".encode("latin-1")})
    assert ok.status_code == 200 and bad.status_code == 401 and odd.status_code == 401
    assert len(calls) >= 3 and all(t == (bytes, bytes) for t in calls)


@pytest.mark.timeout(30)
async def test_join_refuses_worker_hosts_outside_the_allow_list(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=1, overlap=0)) as c:
        outside = await c.client.post(c.url + "/pearl/gpus", headers=AUTH, json={
            "action": "join", "gpus": ["n3:0"], "hosts": {"n3": "169.254.169.254"}})
        malformed = await c.client.post(c.url + "/pearl/gpus", headers=AUTH, json={
            "action": "join", "gpus": ["n3:0"], "hosts": ["10.0.0.3"]})
        assert outside.status_code == 400 and outside.json()["error"]["type"] == "worker_host_not_allowed"
        assert malformed.status_code == 400
        assert len(c.table.rollout_workers()) == 1  # nothing was launched
        inside = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["n3:0"], "hosts": {"n3": "127.0.0.1"}})
        assert inside["admitted"]


def test_allowed_worker_hosts_default_to_loopback_and_take_patterns():
    import argparse

    parser = argparse.ArgumentParser()
    RouterConfig.add_cli_args(parser)
    default = RouterConfig.from_cli_args(parser.parse_args([])).security
    assert default.worker_host_allowed("127.0.0.1") and default.worker_host_allowed("localhost")
    assert not default.worker_host_allowed("10.0.0.3") and not default.worker_host_allowed("example.com")
    custom = RouterConfig.from_cli_args(parser.parse_args(["--allowed-worker-hosts", "10.0.0.*", "gpu-*.lan"])).security
    assert custom.worker_host_allowed("10.0.0.17") and custom.worker_host_allowed("GPU-3.lan")
    assert not custom.worker_host_allowed("10.0.1.1") and not custom.worker_host_allowed("127.0.0.1")


@pytest.mark.timeout(30)
async def test_concurrent_streams_per_client_are_limited_by_name():
    config = with_limits(max_streams_per_client=2)
    async with emulator(*SLOW) as (worker_url, worker):
        async with running_router(regular=[worker_url], config=config) as (url, app, _):
            async with httpx.AsyncClient(timeout=30) as c:
                async def stream(n):
                    async with c.stream("POST", url + "/generate", json={**long_body([1, 2, 3], n), "stream": True}) as r:
                        return r.status_code, await r.aread()

                held = [asyncio.ensure_future(stream(1500)) for _ in range(2)]
                await until(lambda: running(worker) == 2, what="two streams to be running")
                over = await c.post(url + "/generate", json={**long_body([4], 2), "stream": True})
                plain = await c.post(url + "/generate", json=long_body([4], 2))  # not a stream: not counted
                results = await asyncio.gather(*held)
                again = await c.post(url + "/generate", json={**long_body([5], 2), "stream": True})
    assert over.status_code == 429
    assert over.json()["error"]["type"] == "limit_max_streams_per_client"
    assert "max_streams_per_client=2" in over.json()["error"]["message"]
    assert plain.status_code == 200
    assert [s for s, _ in results] == [200, 200]
    assert again.status_code == 200  # the slots were given back


async def test_rid_length_limit_is_named():
    async with running_router(regular=["http://127.0.0.1:9"], config=with_limits(max_rid_length=8)) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.post(url + "/generate", json={"text": "x", "rid": "r" * 9})
    assert r.status_code == 400 and r.json()["error"]["type"] == "limit_max_rid_length"


LIMIT_NAMES = {"max_body_bytes": "limit_max_body_bytes", "max_batch_size": "limit_max_batch_size",
               "max_n": "limit_n", "max_new_tokens": "limit_max_new_tokens",
               "max_streams_per_client": "limit_max_streams_per_client", "max_rid_length": "limit_max_rid_length",
               "max_json_depth": "limit_max_json_depth"}


def test_every_limit_has_a_tested_error_type():
    assert {f.name for f in fields(Limits)} == set(LIMIT_NAMES), "a new limit needs its 4xx name tested here"


def test_every_limit_is_documented():
    text = "".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    missing = [f"--limit-{n.replace('_', '-')} / {kind}" for n, kind in LIMIT_NAMES.items()
               if f"--limit-{n.replace('_', '-')}" not in text or kind not in text]
    assert not missing, missing
