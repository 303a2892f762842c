"""OpenAI requests are in the router's in-flight registry: a drain waits for a running
OpenAI stream instead of stopping its worker under it, and /abort_request reaches it by rid."""
from __future__ import annotations

import asyncio
import json

import httpx

from pearl_sglang.core.events import GpusLeave
from pearl_sglang.router.drain import migrate_off, wait_drained
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import running_router
from tests.support.emulated import emulators

SLOW = ("--time-scale", "1")


def _chat(n: int, rid: str | None = None) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": n, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if rid:
        body["rid"] = rid
    return body


async def _consume(c: httpx.AsyncClient, url: str, body: dict, out: list) -> None:
    async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                out.append(data if data == "[DONE]" else json.loads(data))


async def _until_running(worker_obj, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if worker_obj.engine.loads().num_running_reqs >= 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("request never started")


def _finish_reasons(chunks: list) -> list:
    return [ch["choices"][0]["finish_reason"] for ch in chunks
            if isinstance(ch, dict) and ch.get("choices") and ch["choices"][0].get("finish_reason")]


async def test_drain_waits_for_a_running_openai_stream():
    async with emulators(1, *SLOW) as workers:
        (u0, w0), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0]) as (url, app, store):
            chunks: list = []
            task = asyncio.ensure_future(_consume(c, url, _chat(300), chunks))
            await _until_running(w0)
            assert app[ROUTER].inflight.load() == {0: 1}
            await store.apply([GpusLeave(store.table.worker(0).gpus)])
            assert await migrate_off(app[ROUTER], 0) == 0  # not aborted: nothing to resubmit it from
            assert await wait_drained(app[ROUTER], 0, timeout_s=30)
            assert task.done(), "the drain returned while the OpenAI stream still ran on the worker"
            await task
    assert chunks[-1] == "[DONE]"
    assert _finish_reasons(chunks) == ["length"]
    assert [ch["usage"]["completion_tokens"] for ch in chunks[:-1] if ch.get("usage")] == [300]


async def test_abort_request_reaches_an_openai_stream_by_rid():
    async with emulators(1, *SLOW) as workers:
        (u0, w0), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0]) as (url, app, _):
            chunks: list = []
            task = asyncio.ensure_future(_consume(c, url, _chat(2000, rid="oai-ab"), chunks))
            await _until_running(w0)
            r = await c.post(url + "/abort_request", json={"rid": "oai-ab"})
            assert r.json() == {"aborted": ["oai-ab"]}
            await asyncio.wait_for(task, 10)
            assert len(app[ROUTER].inflight) == 0
    assert _finish_reasons(chunks) == ["abort"]
    assert chunks[-1] == "[DONE]"


async def test_a_rid_already_in_flight_is_refused_on_openai_endpoints():
    async with emulators(1, *SLOW) as workers:
        (u0, w0), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0]) as (url, app, _):
            task = asyncio.ensure_future(_consume(c, url, _chat(300, rid="dup"), []))
            await _until_running(w0)
            r = await c.post(url + "/v1/chat/completions", json={**_chat(5, rid="dup"), "stream": False})
            assert r.status_code == 400 and "already in flight" in r.text
            await c.post(url + "/abort_request", json={"rid": "dup"})
            await task
