"""A non-streaming client's turn whose token budget fits one stream interval goes to its
worker as one JSON document (``workers.client.one_interval``): read over every framing,
with the stream's failures, and through the router with the same answers, the same
partial output kept when its worker is drained, and every longer or streamed turn still
a stream."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import pytest

from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.dispatch import DispatchConfig
from pearl_sglang.router.state import ROUTER
from pearl_sglang.workers.client import Timeouts, generate_whole, one_interval
from pearl_sglang.workers.connections import WorkerConnections
from pearl_sglang.workers.errors import WorkerFailed, WorkerRejected, WorkerStalled, WorkerUnavailable
from tests.router.conftest import running_router
from tests.router.test_worker_http import _chunked, raw_worker
from tests.support.emulated import emulator

DOC = b'{"text": "ab", "output_ids": [7, 8], "meta_info": {"id": "r", "finish_reason": {"type": "length"}}}'


def test_a_budget_within_one_interval_is_asked_as_one_document():
    def body(**sampling):
        return {"input_ids": [1], "sampling_params": sampling}

    assert one_interval(body(max_new_tokens=16, stream_interval=16))
    assert one_interval(body(max_new_tokens=0, stream_interval=16))
    assert not one_interval(body(max_new_tokens=17, stream_interval=16))
    # The router always names both; anything else stays a stream.
    assert not one_interval(body(max_new_tokens=4))
    assert not one_interval(body(stream_interval=16))
    assert not one_interval(body(max_new_tokens=4.0, stream_interval=16))
    assert not one_interval(body(max_new_tokens=True, stream_interval=16))
    assert not one_interval({"input_ids": [1]}) and not one_interval({"sampling_params": None})


async def _whole(connections: WorkerConnections, url: str, **kw) -> list:
    return [d async for d in generate_whole(connections, slot=3, url=url, body={"input_ids": [1]},
                                            timeouts=Timeouts(**kw))]


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
async def test_a_whole_answer_reads_alike_over_every_framing(framing):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    answer = {"length": head + b"Content-Length: %d\r\n\r\n" % len(DOC) + DOC,
              "chunked": head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(DOC, 7),
              "close": head + b"Connection: close\r\n\r\n" + DOC}[framing]
    connections = WorkerConnections(connect_s=5)
    async with raw_worker(answer, piece=5, close=framing == "close") as url:
        for _ in range(3):
            assert await _whole(connections, url) == [json.loads(DOC)]
    assert connections.opened == (3 if framing == "close" else 1)
    connections.close()


async def test_a_whole_answer_fails_as_a_stream_does():
    def answer(status: bytes, body: bytes) -> bytes:
        return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            status, len(body), body)

    connections = WorkerConnections(connect_s=5)
    rejected = b'{"error": {"message": "bad"}}'
    async with raw_worker(answer(b"400 Bad Request", rejected)) as url:
        with pytest.raises(WorkerRejected) as e:
            await _whole(connections, url)
    assert e.value.status == 400 and e.value.body == rejected and e.value.worker_id == "3"
    async with raw_worker(answer(b"503 Service Unavailable", b'{"object": "error", "code": 503}')) as url:
        with pytest.raises(WorkerFailed):
            await _whole(connections, url)
    async with raw_worker(answer(b"200 OK", b'{"text": "no meta"}')) as url:
        with pytest.raises(WorkerFailed, match="meta_info"):
            await _whole(connections, url)
    async with raw_worker(answer(b"200 OK", b"not json")) as url:
        with pytest.raises(WorkerUnavailable):
            await _whole(connections, url)
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(DOC) + DOC[:20]
    async with raw_worker(cut) as url:  # then silence
        with pytest.raises(WorkerStalled):
            await _whole(connections, url, chunk_s=0.3)
    async with raw_worker(cut, close=True) as url:
        with pytest.raises(WorkerUnavailable):
            await _whole(connections, url)
    with pytest.raises(WorkerUnavailable):
        await _whole(connections, "http://127.0.0.1:9")
    connections.close()


def _gen(n, prompt=(5, 6, 7, 8), **kw):
    return {"input_ids": list(prompt), "sampling_params": {"max_new_tokens": n, "ignore_eos": True}, **kw}


async def test_short_turns_of_waiting_clients_are_one_document_with_the_streams_answer(whole_calls):
    logprobs = {"return_logprob": True, "top_logprobs_num": 2}
    async with emulator("--time-scale", "20") as (url, _):
        async with running_router(regular=[url]) as (base, app, _store):
            async with httpx.AsyncClient(timeout=30) as c:
                short = (await c.post(base + "/generate", json=_gen(16, **logprobs))).json()
                assert len(whole_calls) == 1 and whole_calls[0]["sampling_params"]["max_new_tokens"] == 16
                # The same turn streamed, and a longer one: streams, as before.
                async with c.stream("POST", base + "/generate", json=_gen(16, stream=True, **logprobs)) as r:
                    events = [json.loads(line[5:]) for line in [x async for x in r.aiter_lines()]
                              if line.startswith("data:") and line != "data: [DONE]"]
                longer = (await c.post(base + "/generate", json=_gen(17))).json()
                direct = (await c.post(url + "/generate", json=_gen(16, **logprobs))).json()
    assert len(whole_calls) == 1
    assert short["output_ids"] == events[-1]["output_ids"] == direct["output_ids"]
    assert short["text"] == events[-1]["text"] and len(longer["output_ids"]) == 17
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    assert short["meta_info"]["completion_tokens"] == 16 and short["meta_info"]["id"] != direct["meta_info"]["id"]

    def same(meta):  # all but the request's id and its latency
        return {k: v for k, v in meta.items() if k not in ("id", "e2e_latency")}

    assert len(short["meta_info"]["output_token_logprobs"]) == 16
    assert same(short["meta_info"]) == same(events[-1]["meta_info"]) == same(direct["meta_info"])


async def test_a_drained_one_document_turn_keeps_its_partial_output(whole_calls):
    """With an interval as long as the turn, its worker's removal mid-turn answers the
    document with what was generated so far, and the turn ends on the other worker."""
    config = RouterConfig(health_interval_s=3600, dispatch=replace(DispatchConfig(), internal_stream_interval=300))
    async with emulator("--time-scale", "1") as (u0, w0), emulator("--time-scale", "1") as (u1, w1):
        async with running_router(regular=[u0], config=config) as (base, app, _store):
            async with httpx.AsyncClient(timeout=60) as c:
                pending = asyncio.ensure_future(c.post(base + "/generate", json=_gen(300, (7, 1, 9))))
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while w0.engine.loads().num_running_reqs < 1 and loop.time() < deadline:
                    await asyncio.sleep(0.01)
                assert w0.engine.loads().num_running_reqs == 1 and whole_calls
                assert (await c.post(f"{base}/add_worker", params={"url": u1})).status_code == 200
                assert (await c.post(f"{base}/remove_worker", params={"url": u0})).status_code == 200
                out = (await pending).json()
    assert len(out["output_ids"]) == 300 and out["meta_info"]["finish_reason"]["type"] == "length"
    assert app[ROUTER].dispatcher.migrations == 1 and len(whole_calls) == 2
    first, second = whole_calls
    kept = len(second["input_ids"]) - 3
    # The second call carries the first's output as prompt and asks for the rest.
    assert 0 < kept < 300 and second["sampling_params"]["max_new_tokens"] == 300 - kept
    assert second["input_ids"][:3] == [7, 1, 9] and out["output_ids"][:kept] == second["input_ids"][3:]
