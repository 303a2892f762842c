"""The router over emulated SGLang workers (real HTTP on loopback, in this event loop):
token-exact stitching across forced migrations (streaming too), cache affinity, the
admission pause, and no loss when 30% of the workers leave during a burst."""
from __future__ import annotations

import asyncio
import json
import random

import httpx

from pearl_sglang.core.events import GpusLeave, WorkerLeft
from pearl_sglang.router.drain import migrate_off, wait_drained
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import running_router
from tests.support.emulated import emulator, emulators

SLOW = ("--time-scale", "1")          # tiny profile in real time: long outputs take seconds
FAST = ("--time-scale", "20")


def _long(prompt, n=400, rid=None):
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
    if rid:
        body["rid"] = rid
    return body


async def _post(client, url, body):
    r = await client.post(url, json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def _leave(store, app, slot):
    """What the control plane does when a worker's GPUs are reclaimed."""
    gpus = store.table.worker(slot).gpus
    await store.apply([GpusLeave(gpus)])
    moved = await migrate_off(app[ROUTER], slot)
    assert await wait_drained(app[ROUTER], slot, timeout_s=30)
    await store.apply([WorkerLeft(slot)])
    return moved


async def _until_running(worker_obj, n=1, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if worker_obj.engine.loads().num_running_reqs >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("request never started")


async def test_forced_migration_is_token_exact():
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    async with emulators(3, *SLOW) as workers:
        (u0, w0), (u1, _), (u2, _) = workers
        async with httpx.AsyncClient(timeout=60) as c:
            reference = await _post(c, u2 + "/generate", _long(prompt))
            async with running_router(regular=[u0, u1]) as (url, app, store):
                task = asyncio.ensure_future(_post(c, url + "/generate", _long(prompt, rid="mig")))
                await _until_running(w0)
                await asyncio.sleep(0.3)
                assert await _leave(store, app, 0) == 1
                out = await task
    assert out["output_ids"] == reference["output_ids"]
    assert out["text"] == reference["text"]
    assert out["meta_info"]["pearl_attempts"] == 2
    assert out["meta_info"]["completion_tokens"] == 400
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
    assert out["meta_info"]["weight_versions"] == [{"version": "default", "start": 0, "end": 400}]


async def test_forced_migration_streaming_is_one_continuous_stream():
    prompt = [2, 7, 1, 8, 2, 8]
    async with emulators(3, *SLOW) as workers:
        (u0, w0), (u1, _), (u2, _) = workers
        async with httpx.AsyncClient(timeout=60) as c:
            reference = await _post(c, u2 + "/generate", _long(prompt))
            async with running_router(regular=[u0, u1]) as (url, app, store):
                chunks = []

                async def consume():
                    body = {**_long(prompt), "stream": True}
                    async with c.stream("POST", url + "/generate", json=body) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data:"):
                                data = line[5:].strip()
                                chunks.append(data if data == "[DONE]" else json.loads(data))

                task = asyncio.ensure_future(consume())
                await _until_running(w0)
                await asyncio.sleep(0.3)
                await _leave(store, app, 0)
                await task
    assert chunks[-1] == "[DONE]"
    body = chunks[:-1]
    for prev, cur in zip(body, body[1:]):
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"], "stream went backwards"
    assert all(ch["meta_info"]["finish_reason"] is None for ch in body[:-1])
    assert body[-1]["output_ids"] == reference["output_ids"]


async def test_affinity_keeps_a_trajectorys_turns_on_one_worker():
    rng = random.Random(5)
    async with emulators(4, *FAST) as workers:
        urls = [u for u, _ in workers]
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=urls) as (url, app, store):
                trajectories = [[rng.randrange(10, 900) for _ in range(300)] for _ in range(4)]
                cached = []
                for turn in range(4):
                    outs = await asyncio.gather(*(
                        _post(c, url + "/generate", {"input_ids": ctx, "sampling_params": {
                            "max_new_tokens": 40, "ignore_eos": True}}) for ctx in trajectories))
                    for i, out in enumerate(outs):
                        trajectories[i] = trajectories[i] + out["output_ids"] + [rng.randrange(10, 900)
                                                                                  for _ in range(100)]
                    cached.append([o["meta_info"]["cached_tokens"] for o in outs])
            routed = app[ROUTER].metrics.routed
    per_slot = {s.labels["slot"]: s.value for s in routed.collect()[0].samples if s.name.endswith("_total")}
    # Four trajectories spread over the four workers, then each stays put: 4 turns each.
    assert sorted(per_slot.values()) == [4.0, 4.0, 4.0, 4.0]
    assert all(c > 0 for c in cached[-1]), cached  # later turns hit their worker's prefix cache


async def test_admission_pause_holds_then_releases():
    async with emulator(*FAST) as (u0, _):
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u0]) as (url, app, _):
                gate = app[ROUTER].gate
                async with gate.closed("test finalization"):
                    tasks = [asyncio.ensure_future(_post(c, url + "/generate", {
                        "input_ids": [1, 2, i + 3], "sampling_params": {"max_new_tokens": 4}}))
                        for i in range(5)]
                    await asyncio.sleep(0.5)
                    assert not any(t.done() for t in tasks)
                    assert gate.waiting == 5
                outs = await asyncio.gather(*tasks)
                assert all(o["meta_info"]["finish_reason"]["type"] in ("length", "stop") for o in outs)
                gate.wait_timeout_s = 0.2
                async with gate.closed("a slow reconfiguration"):
                    r = await c.post(url + "/generate", json={"input_ids": [1], "sampling_params": {}})
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "admission_timeout"
    assert "a slow reconfiguration" in r.json()["error"]["message"]


async def test_no_request_lost_when_30_percent_of_workers_leave_during_a_burst():
    rng = random.Random(11)
    prompts = [[rng.randrange(10, 900) for _ in range(rng.randrange(4, 40))] for _ in range(500)]
    async with emulators(10, "--time-scale", "0.5") as workers, emulator("--time-scale", "50") as (ref_url, _):
        urls = [u for u, _ in workers]
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=1000)) as c:
            async with running_router(regular=urls) as (url, app, store):
                def body(p):
                    return {"input_ids": p, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
                tasks = [asyncio.ensure_future(_post(c, url + "/generate", body(p))) for p in prompts]
                leaving = (0, 4, 7)
                for _ in range(3000):  # leave in the middle of the burst, not before it
                    load = app[ROUTER].inflight.load()
                    if len(app[ROUTER].inflight) >= 300 or all(load.get(s, 0) >= 5 for s in leaving):
                        break
                    await asyncio.sleep(0.005)
                moved = sum(await asyncio.gather(*(_leave(store, app, slot) for slot in leaving)))
                outs = await asyncio.gather(*tasks)
                migrated = app[ROUTER].dispatcher.migrations
            refs = await asyncio.gather(*(_post(c, ref_url + "/generate", body(p)) for p in prompts))
    assert len(outs) == 500
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in refs]
    # Every output is token-exact (above), which is the claim. How many of the moved ones
    # needed a migration depends on the host's speed: one can finish on its own worker
    # between the drain's decision and its abort landing (108 of 150 did on a loaded host).
    assert moved >= 15, (moved, migrated)


async def test_a_migrated_request_whose_worker_answers_the_abort_with_an_error_still_moves(monkeypatch):
    """SGLang ends a PD request whose prefill was aborted under it (the drain of its
    prefill worker) with ``abort`` and status 500 (a failed KV transfer) on the decode
    worker. The router aborted it to move it: it moves, it is not the request's end."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    async with emulators(3, *SLOW) as workers:
        (u0, w0), (u1, _), (u2, _) = workers
        original = w0.engine.abort
        monkeypatch.setattr(w0.engine, "abort", lambda rid=None, **kw: original(
            rid, **{**kw, "message": "Aborted by AbortReq.", "status_code": 500}))
        async with httpx.AsyncClient(timeout=60) as c:
            reference = await _post(c, u2 + "/generate", _long(prompt))
            async with running_router(regular=[u0, u1]) as (url, app, store):
                task = asyncio.ensure_future(_post(c, url + "/generate", _long(prompt, rid="mig500")))
                await _until_running(w0)
                await asyncio.sleep(0.3)
                assert await _leave(store, app, 0) == 1
                out = await task
    assert out["output_ids"] == reference["output_ids"]
    assert out["meta_info"]["pearl_attempts"] == 2
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 400}


async def test_a_batch_item_refused_by_its_worker_stops_the_others_at_their_workers():
    async with emulators(1, *SLOW) as workers:
        (u0, w0), = workers
        async with httpx.AsyncClient(timeout=60) as c, running_router(regular=[u0]) as (url, app, _):
            long = {"max_new_tokens": 3000, "ignore_eos": True}
            body = {"input_ids": [[3, 1, 4], [2, 7]], "rid": ["long", "bad"],
                    "sampling_params": [long, {**long, "temperature": "hot"}]}  # the worker's 400
            r = await c.post(url + "/generate", json=body)
            assert r.status_code == 400, r.text
            # The batch's answer is the refusal: the long item is not left running unread.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while w0.engine.loads().num_running_reqs + w0.engine.loads().num_waiting_reqs:
                assert loop.time() < deadline, "the batch's other item kept running at its worker"
                await asyncio.sleep(0.02)
            assert len(app[ROUTER].inflight) == 0
