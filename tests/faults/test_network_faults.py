"""Network faults between the router and a worker, injected by ``FaultProxy``: a worker
that hangs, answers slowly, resets or cuts its connections, mid-stream or before the first
byte. The router must end every such request within its timeouts, either completed
elsewhere token for token (one continuous stream for a streaming client) or as a bounded
5xx error, and never hang."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from pearl_sglang.router.state import ROUTER
from tests.support.fault_proxy import Fault, FaultProxy
from tests.faults.support import (
    assert_continuous, collect_sse, fault_config, long_body, reference,
)
from tests.router.conftest import running_router
from tests.support.emulated import emulator, emulators

PACED = ("--time-scale", "0.5")  # ~4 ms a token: a 600-token answer streams for ~2.5 s
PROMPT = [11, 22, 33, 44, 55, 66]

MID_STREAM_FAULTS = [
    pytest.param(dict(fault=Fault.HANG), id="hang"),
    pytest.param(dict(fault=Fault.DELAY, delay_s=5.0), id="slower-than-chunk-timeout"),
    pytest.param(dict(fault=Fault.RESET), id="reset"),
    pytest.param(dict(fault=Fault.CUT, cut_after=300), id="cut-after-300-bytes"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", MID_STREAM_FAULTS)
async def test_mid_stream_fault_moves_the_request_token_exact(fault):
    body = long_body(PROMPT, 600)
    expected = await reference(body)
    async with emulators(2, *PACED) as [(u0, w0), (u1, _)], FaultProxy.to(u0) as proxy:
        # The proxied worker is slot 0: an idle router sends the first attempt there.
        async with running_router(regular=[proxy.url, u1], config=fault_config()) as (url, app, _):
            injected_at: list[int] = []

            async def inject(chunk):
                if len(chunk["output_ids"]) >= 40 and not injected_at:
                    injected_at.append(len(chunk["output_ids"]))
                    proxy.set(**fault)

            loop = asyncio.get_running_loop()
            started = loop.time()
            async with httpx.AsyncClient(timeout=30) as c:
                events = await collect_sse(c, url + "/generate", body, on_chunk=inject)
            elapsed = loop.time() - started
            assert len(app[ROUTER].inflight) == 0
        w0.engine.abort(abort_all=True)  # an orphan left on a hung worker (see below)
    chunks = assert_continuous(events)
    assert injected_at and injected_at[0] < 600, "the fault was never injected mid-stream"
    assert chunks[-1]["output_ids"] == expected["output_ids"]
    assert chunks[-1]["text"] == expected["text"]
    assert chunks[-1]["meta_info"]["pearl_attempts"] == 2
    assert chunks[-1]["meta_info"]["completion_tokens"] == 600
    assert elapsed < 15, elapsed


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", [Fault.HANG, Fault.RESET])
async def test_fault_before_the_first_byte_is_retried_elsewhere(fault):
    body = long_body(PROMPT, 50)
    expected = await reference(body)
    async with emulators(2, "--time-scale", "20") as [(u0, _), (u1, _)], FaultProxy.to(u0) as proxy:
        proxy.set(fault)
        async with running_router(regular=[proxy.url, u1], config=fault_config()) as (url, app, _):
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(url + "/generate", json=body)
                chat = await c.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4})
            open_circuits = app[ROUTER].breakers._failures  # noqa: SLF001 - the breaker saw it
            open_slots = app[ROUTER].breakers.open_slots()
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == expected["output_ids"]
    assert chat.status_code == 200, chat.text
    if fault is Fault.HANG:
        # A hang is a stall: the worker leaves routing at once, the second call goes elsewhere.
        assert proxy.accepted == 1 and 0 in open_slots
    else:
        assert proxy.accepted >= 2  # both calls tried the faulty worker first
        assert open_circuits.get(0, 0) >= 2


@pytest.mark.timeout(30)
async def test_slow_worker_within_the_chunk_timeout_is_not_abandoned():
    body = long_body(PROMPT, 120)
    expected = await reference(body)
    async with emulators(2, "--time-scale", "5") as [(u0, _), (u1, _)], FaultProxy.to(u0) as proxy:
        proxy.set(Fault.DELAY, delay_s=0.1)
        async with running_router(regular=[proxy.url, u1], config=fault_config(chunk_s=1.0)) as (url, app, _):
            async with httpx.AsyncClient(timeout=30) as c:
                events = await collect_sse(c, url + "/generate", body)
    chunks = assert_continuous(events)
    assert chunks[-1]["output_ids"] == expected["output_ids"]
    assert "pearl_attempts" not in chunks[-1]["meta_info"]  # no migration: slow is not dead
    assert not app[ROUTER].breakers.open_slots() and not app[ROUTER].breakers._failures  # noqa: SLF001


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stream", [False, True])
async def test_hung_only_worker_is_a_bounded_error(stream):
    config = fault_config(chunk_s=0.5, max_attempts=2)
    async with emulator("--time-scale", "20") as (u0, _), FaultProxy.to(u0) as proxy:
        proxy.set(Fault.HANG)
        async with running_router(regular=[proxy.url], config=config) as (url, app, _):
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with httpx.AsyncClient(timeout=20) as c:
                r = await c.post(url + "/generate", json={**long_body(PROMPT, 10), "stream": stream})
            elapsed = loop.time() - started
            assert len(app[ROUTER].inflight) == 0
    assert elapsed < 2 * 0.5 + 3, elapsed
    # The stall opens the only worker's circuit: attach mode then says at once that no
    # worker can take the request (503), or the attempts ran out first (502).
    assert (r.status_code, r.json()["error"]["type"]) in ((502, "upstream_failed"), (503, "no_worker")), r.text


@pytest.mark.timeout(30)
async def test_worker_hung_mid_stream_with_no_alternative_ends_with_partial_output_error():
    """The only worker stops answering after some tokens: the client's stream ends with an
    error event (never a hang) after the tokens it already received."""
    config = fault_config(chunk_s=0.5, max_attempts=2)
    async with emulator(*PACED) as (u0, w0), FaultProxy.to(u0) as proxy:
        async with running_router(regular=[proxy.url], config=config) as (url, app, _):
            async def inject(chunk):
                if "output_ids" in chunk and len(chunk["output_ids"]) >= 20 and proxy.fault is Fault.PASS:
                    proxy.set(Fault.HANG)  # once: nothing sets it back while the stream runs

            async with httpx.AsyncClient(timeout=20) as c:
                events = await asyncio.wait_for(
                    collect_sse(c, url + "/generate", long_body(PROMPT, 600), on_chunk=inject), 10)
            assert len(app[ROUTER].inflight) == 0
        # The partitioned worker never learnt that the router gave up: end its orphan
        # request so that its graceful shutdown does not wait for it.
        w0.engine.abort(abort_all=True)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] in ("upstream_failed", "no_worker")
    assert len(events[-3]["output_ids"]) >= 20


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", [Fault.HANG, Fault.RESET])
async def test_openai_stream_whose_worker_fails_mid_stream_ends_with_an_error_event(fault, caplog):
    """Past the first byte a proxied OpenAI stream (here: one with tools) cannot move: the
    client gets an explicit error event and a well-formed end of the chunked body, never a
    500 inside it."""
    config = fault_config(chunk_s=0.5, max_attempts=2)
    async with emulator(*PACED) as (u0, w0), FaultProxy.to(u0) as proxy:
        async with running_router(regular=[proxy.url], config=config) as (url, app, _):
            async def inject(chunk):
                if proxy.fault is Fault.PASS and len(events) >= 5:
                    proxy.set(fault)

            events: list = []
            async with httpx.AsyncClient(timeout=20) as c:
                async with c.stream("POST", url + "/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 600, "ignore_eos": True,
                        "stream": True, "tools": []}) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            events.append(line[5:].strip())
                            await inject(events[-1])
        w0.engine.abort(abort_all=True)
    assert len(events) > 5
    last = json.loads(events[-1])
    assert last["error"]["type"] == "upstream_failed", events[-3:]
    # The router's own log (the emulated worker's aiohttp server shares this process).
    errors = [r for r in caplog.records if r.name.startswith("pearl.router") and r.levelno >= 40]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", [Fault.HANG, Fault.RESET])
async def test_openai_chat_stream_whose_worker_fails_mid_stream_moves_token_exact(fault):
    """A text chat stream runs through the dispatcher: a worker that hangs or resets under
    it costs the client nothing; the content is what an undisturbed worker answers."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 600,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    async with emulators(2, *PACED) as [(u0, _), (u1, _)], FaultProxy.to(u0) as p0, FaultProxy.to(u1) as p1:
        proxies = [p0, p1]
        async with running_router(regular=[p0.url, p1.url], config=fault_config(chunk_s=0.5)) as (url, app, _):
            faulted: list = []
            seen: list = []

            async def inject(event):
                seen.append(event)
                if not faulted and len(seen) >= 5:
                    (slot, _), = app[ROUTER].inflight.load().items()
                    faulted.append(slot)
                    proxies[slot].set(fault)

            async with httpx.AsyncClient(timeout=20) as c:
                events = await collect_sse(c, url + "/v1/chat/completions", body, on_chunk=inject)
                survivor = (u1, u0)[faulted[0]]
                expected = (await c.post(survivor + "/v1/chat/completions", json=body)).json()
            assert app[ROUTER].dispatcher.migrations >= 1
    assert events[-1] == "[DONE]"
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e.get("choices"))
    assert content == expected["choices"][0]["message"]["content"]
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")][-1] == "length"
    assert [e["usage"]["completion_tokens"] for e in events[:-1] if e.get("usage")] == [600]
