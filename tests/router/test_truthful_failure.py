"""Readiness, failure answers and metrics tell the truth, and tell it fast: an open circuit
makes a worker unready, attach mode refuses at once when no worker can serve, and every
error reply is counted, raised ones included."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import httpx
import pytest

from pearl_sglang.core.state import Role
from pearl_sglang.router.dispatch import DispatchConfig
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import running_router, with_limits
from tests.support.emulated import emulator

DEAD = "http://127.0.0.1:9"


def _config(**kw):
    return replace(with_limits(max_body_bytes=1024), **kw)


async def test_readiness_is_not_ready_when_the_only_worker_has_an_open_circuit():
    async with running_router(regular=[DEAD], config=_config(health_interval_s=0.05, failures_to_open=1)) \
            as (url, app, _):
        async with httpx.AsyncClient(timeout=10) as c:
            deadline = time.monotonic() + 5
            while not app[ROUTER].breakers.open_slots() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            r = await c.get(url + "/readiness")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "not_ready" and body["open_circuits"] and body["missing_roles"] == ["colocated"]


async def test_readiness_names_the_missing_decode_role():
    async with emulator("--time-scale", "50") as (p, _), emulator("--time-scale", "50") as (d, _):
        async with running_router(prefill=[(p, 8998)], decode=[d]) as (url, app, store):
            async with httpx.AsyncClient(timeout=10) as c:
                ready = await c.get(url + "/readiness")
                decode = next(w for w in store.table.active() if w.role is Role.DECODE)
                for _ in range(app[ROUTER].breakers.failures_to_open):
                    app[ROUTER].breakers.failure(decode.slot)
                unready = await c.get(url + "/readiness")
    assert ready.status_code == 200, ready.text
    assert unready.status_code == 503 and unready.json()["missing_roles"] == ["decode"], unready.text


@pytest.mark.timeout(60)
async def test_attach_mode_refuses_at_once_when_no_worker_can_serve():
    config = _config(failures_to_open=1, dispatch=DispatchConfig(max_attempts=2, route_wait_s=60.0))
    async with running_router(regular=[DEAD], config=config) as (url, _, _):
        async with httpx.AsyncClient(timeout=30) as c:
            first = await c.post(url + "/generate", json={"text": "x"})
            started = time.monotonic()
            second = await c.post(url + "/generate", json={"text": "x"})
            chat = await c.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            elapsed = time.monotonic() - started
    assert first.status_code in (502, 503), first.text
    assert second.status_code == 503 and second.json()["error"]["type"] == "no_worker", second.text
    assert chat.status_code == 503, chat.text
    assert elapsed < 5, elapsed


async def test_metrics_count_raised_errors():
    async with running_router(regular=[DEAD], config=_config()) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            await c.post(url + "/generate", content=b"{bad", headers={"Content-Type": "application/json"})
            await c.post(url + "/generate", json={"text": "x" * 5000})
            await c.get(url + "/pearl/state")
            await c.get(url + "/nope")
            text = (await c.get(url + "/metrics")).text
    for endpoint, status in (("/generate", "400"), ("/generate", "413"), ("/pearl/state", "401"),
                             ("unmatched", "404")):
        assert f'pearl_requests_total{{endpoint="{endpoint}",status="{status}"}} 1.0' in text, (endpoint, status)
