"""Endpoints and headers a client of SGLang or sglang-router expects from the router."""
from __future__ import annotations

import time
from dataclasses import replace

import httpx
import pytest

from tests.router.conftest import running_router, with_limits
from tests.support.emulated import emulator

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_get_prefixed_info_endpoints_answer_like_the_plain_ones():
    async with emulator("--time-scale", "50") as (w, _):
        async with running_router(regular=[w]) as (url, _, _):
            async with httpx.AsyncClient(timeout=10) as c:
                plain = [await c.get(url + p) for p in ("/model_info", "/server_info")]
                prefixed = [await c.get(url + p) for p in ("/get_model_info", "/get_server_info")]
    assert [r.status_code for r in plain + prefixed] == [200] * 4
    assert prefixed[0].json() == plain[0].json()
    assert prefixed[1].json()["pearl"] == plain[1].json()["pearl"]


async def test_health_generate_is_an_empty_200_over_a_healthy_worker():
    async with emulator("--time-scale", "50") as (w, _):
        async with running_router(regular=[w]) as (url, _, _):
            async with httpx.AsyncClient(timeout=10) as c:
                r = await c.get(url + "/health_generate")
    assert r.status_code == 200 and r.content == b""


async def test_health_generate_is_a_fast_503_when_no_worker_passes():
    config = replace(with_limits(), timeouts=replace(with_limits().timeouts, control_s=2.0))
    async with running_router(regular=["http://127.0.0.1:9"], config=config) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            started = time.monotonic()
            r = await c.get(url + "/health_generate")
    assert r.status_code == 503 and r.json()["error"]["type"] == "no_worker", r.text
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}, "stream": True}),
    ("/v1/chat/completions", {**CHAT, "stream": True}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "stream": True}),
])
async def test_streams_carry_the_charset(path, body):
    async with emulator("--time-scale", "50") as (w, _):
        async with running_router(regular=[w]) as (url, _, _):
            async with httpx.AsyncClient(timeout=10) as c:
                r = await c.post(url + path, json=body)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
