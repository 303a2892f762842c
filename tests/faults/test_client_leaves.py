"""A client that leaves frees its worker: a non-streaming request is aborted at the worker
soon after its client hangs up, and a client leaving mid-stream is an ordinary event (no
error, no traceback), with its request aborted too. Real SGLang and the emulator."""
from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from pearl_sglang.router.state import ROUTER
from tests.faults.support import fault_config, until
from tests.router.conftest import running_router

KINDS = [pytest.param("emulator", marks=pytest.mark.timeout(60)),
         pytest.param("sglang", marks=[pytest.mark.realsglang, pytest.mark.timeout(400)])]
BODY = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 8000, "ignore_eos": True, "temperature": 0}}


def _busy(worker_url: str) -> int:
    loads = httpx.get(worker_url + "/v1/loads", timeout=5).json()["loads"]
    return sum(x["num_running_reqs"] + x["num_waiting_reqs"] for x in loads)


async def _until_idle(worker_url: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await asyncio.to_thread(_busy, worker_url):
        assert loop.time() < deadline, "the worker still generates for a client that left"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("kind", KINDS)
async def test_non_streaming_request_is_aborted_when_its_client_leaves(kind, worker_sets):
    worker, _ = worker_sets(kind)
    await _until_idle(worker.url, 60)
    async with running_router(regular=[worker.url], config=fault_config(chunk_s=30.0)) as (url, app, _):
        async with httpx.AsyncClient(timeout=60) as c:
            call = asyncio.ensure_future(c.post(url + "/generate", json=BODY))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not await asyncio.to_thread(_busy, worker.url):
                assert loop.time() < deadline and not call.done(), "the request never ran"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            call.cancel()  # the client hangs up; its connection closes
            await asyncio.gather(call, return_exceptions=True)
        await _until_idle(worker.url, 5)
        await until(lambda: len(app[ROUTER].inflight) == 0, timeout=5, what="router in-flight empty")
        async with httpx.AsyncClient(timeout=10) as c:
            metrics = (await c.get(url + "/metrics")).text
    assert 'pearl_requests_total{endpoint="/generate",status="499"} 1.0' in metrics


@pytest.mark.parametrize("path,body", [
    ("/generate", {**BODY, "stream": True}),
    ("/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 8000, "stream": True,
                         "ignore_eos": True, "temperature": 0}),
])
@pytest.mark.parametrize("kind", KINDS)
async def test_client_leaving_mid_stream_is_a_normal_event(kind, path, body, worker_sets, caplog):
    worker, _ = worker_sets(kind)
    await _until_idle(worker.url, 60)
    caplog.set_level(logging.INFO)
    async with running_router(regular=[worker.url], config=fault_config(chunk_s=30.0)) as (url, app, _):
        async with httpx.AsyncClient(timeout=60) as c:
            async with c.stream("POST", url + path, json=body) as r:
                assert r.status_code == 200
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data:")
                    if seen >= 3:
                        break
        await _until_idle(worker.url, 10)
        await until(lambda: len(app[ROUTER].inflight) == 0, timeout=5, what="router in-flight empty")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [(r.name, r.getMessage()) for r in errors]
    assert any("left" in r.getMessage() for r in caplog.records if r.name == "pearl.router")
