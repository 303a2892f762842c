"""OpenAI requests are in the router's in-flight registry. Those that run through the
dispatcher (text chat and completions, each of their n choices an item) move off a
drained worker and are aborted by rid; those kept on the proxy (tools, ...) are waited
for by a drain instead of having their worker stopped under them."""
from __future__ import annotations

import asyncio
import json

import httpx

from pearl_sglang.core.events import GpusLeave
from pearl_sglang.router.drain import migrate_off, wait_drained
from pearl_sglang.router.state import ROUTER
from tests.faults.support import until
from tests.router.conftest import running_router
from tests.support.emulated import emulators

SLOW = ("--time-scale", "1")


def _chat(n: int, rid: str | None = None, *, proxied: bool = False) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": n, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if rid:
        body["rid"] = rid
    if proxied:
        body["tools"] = []  # the worker's OpenAI layer must answer: the proxy path
    return body


def _content(chunks: list) -> str:
    return "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                   if isinstance(ch, dict) and ch.get("choices"))


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


async def test_drain_migrates_a_running_chat_stream_token_exact():
    async with emulators(2, *SLOW) as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            expected = (await c.post(workers[0][0] + "/v1/chat/completions",
                                     json={**_chat(300), "stream": False})).json()
            async with running_router(regular=[u for u, _ in workers]) as (url, app, store):
                chunks: list = []
                task = asyncio.ensure_future(_consume(c, url, _chat(300), chunks))
                await until(lambda: app[ROUTER].inflight.load(), what="the stream to be placed")
                (slot, _), = app[ROUTER].inflight.load().items()
                await _until_running(workers[slot][1])
                await store.apply([GpusLeave(store.table.worker(slot).gpus)])
                assert await migrate_off(app[ROUTER], slot) == 1
                assert await wait_drained(app[ROUTER], slot, timeout_s=30)
                assert not task.done(), "the stream ended with its worker instead of moving"
                await asyncio.wait_for(task, 60)
                assert app[ROUTER].dispatcher.migrations == 1
    assert chunks[-1] == "[DONE]"
    assert _finish_reasons(chunks) == ["length"]
    assert _content(chunks) == expected["choices"][0]["message"]["content"]
    usage = [ch["usage"] for ch in chunks[:-1] if ch.get("usage")]
    assert [(u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) for u in usage] == [
        (expected["usage"]["prompt_tokens"], 300, expected["usage"]["prompt_tokens"] + 300)]


async def test_drain_waits_for_a_running_proxied_openai_stream():
    async with emulators(1, *SLOW) as workers:
        (u0, w0), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0]) as (url, app, store):
            chunks: list = []
            task = asyncio.ensure_future(_consume(c, url, _chat(300, proxied=True), chunks))
            await _until_running(w0)
            assert app[ROUTER].inflight.load() == {0: 1}
            await store.apply([GpusLeave(store.table.worker(0).gpus)])
            assert await migrate_off(app[ROUTER], 0) == 0  # not aborted: nothing to resubmit it from
            assert await wait_drained(app[ROUTER], 0, timeout_s=30)
            # The drain returns when the router has passed the whole answer on (the slot
            # emptied); the client may still be reading its last bytes.
            assert w0.engine.loads().num_running_reqs == 0, \
                "the drain returned while the OpenAI stream still ran on the worker"
            assert app[ROUTER].inflight.load() == {}
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


def _by_choice(chunks: list, n: int) -> tuple[list[str], list[list]]:
    """Each choice's streamed content and finish reasons, from chunks of any order."""
    texts, reasons = [""] * n, [[] for _ in range(n)]
    for ch in chunks:
        if isinstance(ch, dict) and ch.get("choices"):
            (c,) = ch["choices"]
            texts[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                reasons[c["index"]].append(c["finish_reason"])
    return texts, reasons


async def test_n_choices_run_as_dispatcher_items_and_answer_as_the_worker_does():
    async with emulators(2) as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {**_chat(40), "stream": False, "n": 3}
            direct = (await c.post(workers[0][0] + "/v1/chat/completions", json=body)).json()
            async with running_router(regular=[u for u, _ in workers]) as (url, app, _):
                routed = (await c.post(url + "/v1/chat/completions", json={**body, "rid": "grp"})).json()
                chunks: list = []
                await _consume(c, url, {**_chat(40), "n": 3}, chunks)
                assert len(app[ROUTER].inflight) == 0
    assert routed["id"] == "grp"
    assert [ch["index"] for ch in routed["choices"]] == [0, 1, 2]
    assert [ch["message"] for ch in routed["choices"]] == [ch["message"] for ch in direct["choices"]]
    assert routed["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert routed["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == 120
    texts, reasons = _by_choice(chunks, 3)
    assert texts == [ch["message"]["content"] for ch in direct["choices"]]
    assert reasons == [["length"]] * 3
    usage = [ch["usage"] for ch in chunks[:-1] if ch.get("usage")]
    assert chunks[-1] == "[DONE]" and chunks[-2].get("usage") and len(usage) == 1
    assert usage[0]["completion_tokens"] == 120 and usage[0]["prompt_tokens"] == direct["usage"]["prompt_tokens"]


async def test_n_choices_move_off_a_drained_worker_and_are_aborted_by_the_request_rid():
    async with emulators(2, *SLOW) as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            expected = (await c.post(workers[0][0] + "/v1/chat/completions",
                                     json={**_chat(300), "stream": False})).json()
            async with running_router(regular=[u for u, _ in workers]) as (url, app, store):
                st = app[ROUTER]
                chunks: list = []
                task = asyncio.ensure_future(_consume(c, url, {**_chat(300), "n": 2}, chunks))
                await until(lambda: sum(st.inflight.load().values()) == 2, what="both choices placed")
                load = dict(st.inflight.load())  # a copy: the registry's own map changes
                for slot in load:
                    await _until_running(workers[slot][1])
                slot = max(load, key=load.get)  # both, with prefix affinity
                await store.apply([GpusLeave(store.table.worker(slot).gpus)])
                assert await migrate_off(st, slot) == load[slot]
                assert await wait_drained(st, slot, timeout_s=30)
                assert not task.done(), "the choices ended with their worker instead of moving"
                await asyncio.wait_for(task, 60)
                assert st.dispatcher.migrations == load[slot]
                texts, reasons = _by_choice(chunks, 2)
                assert texts == [expected["choices"][0]["message"]["content"]] * 2
                assert reasons == [["length"]] * 2

                aborted: list = []
                task = asyncio.ensure_future(_consume(c, url, {**_chat(2000, rid="grp"), "n": 2}, aborted))
                await until(lambda: sum(st.inflight.load().values()) == 2, what="both choices placed")
                r = await c.post(url + "/abort_request", json={"rid": "grp"})
                assert sorted(r.json()["aborted"]) == ["grp_0", "grp_1"]
                await asyncio.wait_for(task, 10)
                assert len(st.inflight) == 0
    assert _by_choice(aborted, 2)[1] == [["abort"]] * 2
    assert aborted[-1] == "[DONE]"


async def test_a_proxied_answer_sent_whole_may_take_longer_than_the_stall_bound():
    # Found by fuzzing: a long non-streaming proxied request (logprobs, tools, ...) was read
    # with the streaming stall bound, so every worker in turn was called stalled (502, and
    # every circuit open) while generating it.
    from dataclasses import replace

    from tests.router.conftest import with_limits

    config = with_limits()
    config = replace(config, timeouts=replace(config.timeouts, chunk_s=0.3))
    async with emulators(1, *SLOW) as workers:
        (u0, _), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0], config=config) as (url, app, _):
            body = {"model": "m", "prompt": "a long answer", "max_tokens": 600, "ignore_eos": True, "logprobs": 1}
            loop = asyncio.get_running_loop()
            started = loop.time()
            r = await c.post(url + "/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert loop.time() - started > 0.3, "the answer came within one stall bound: nothing tested"
            assert r.json()["usage"]["completion_tokens"] == 600
            assert not app[ROUTER].breakers.open_slots()


async def _worker_idle(worker_obj, timeout=10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while worker_obj.engine.loads().num_running_reqs + worker_obj.engine.loads().num_waiting_reqs:
        assert loop.time() < deadline, "the worker kept running the aborted request"
        await asyncio.sleep(0.02)


async def test_a_proxied_request_its_worker_knows_by_no_rid_is_aborted_by_the_router():
    # Found by fuzzing: /abort_request answered that it aborted a proxied n > 1 (or batched)
    # request, which SGLang knows by other rids, and the request ran to its end.
    async with emulators(1, *SLOW) as workers:
        (u0, w0), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0]) as (url, app, _):
            st = app[ROUTER]
            chunks: list = []
            task = asyncio.ensure_future(_consume(c, url, {**_chat(3000, rid="grp", proxied=True), "n": 2}, chunks))
            await _until_running(w0)
            r = await c.post(url + "/abort_request", json={"rid": "grp"})
            assert r.json() == {"aborted": ["grp"]}
            await asyncio.wait_for(task, 10)
            assert chunks[-1] == "[DONE]" and chunks[-2]["error"]["type"] == "request_aborted"
            await _worker_idle(w0)
            assert len(st.inflight) == 0

            whole = asyncio.ensure_future(c.post(url + "/v1/completions", json={
                "model": "m", "prompt": ["a", "b"], "max_tokens": 3000, "ignore_eos": True}))
            await _until_running(w0)
            r = await c.post(url + "/abort_request", json={"abort_all": True})
            assert len(r.json()["aborted"]) == 1
            answer = await asyncio.wait_for(whole, 10)
            assert answer.status_code == 499 and answer.json()["error"]["type"] == "request_aborted"
            await _worker_idle(w0)
            assert len(st.inflight) == 0
