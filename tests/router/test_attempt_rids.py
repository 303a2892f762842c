"""Each attempt of a request runs on its workers under its own rid, and the client's abort
by its own rid reaches the attempt in flight.

SGLang aborts, 2 s after a stream ends, a live request under that stream's rid (the
emulator does too, see tests/conformance/test_generate.py), so moving a request off an
engine and back onto it under the client's rid would end every later attempt."""
from __future__ import annotations

import asyncio
import json

import httpx

from pearl_sglang.router.dispatch import DispatchConfig
from tests.router.test_worker_api import SLOW, _config, _job_done
from tests.router.conftest import running_router
from tests.support.emulated import emulator

LONG = 2500  # ~5 s at the tiny profile's pace: outlives the 2 s abort after a stream's end


async def _stream(c: httpx.AsyncClient, base: str, rid: str, first_chunk: asyncio.Event) -> dict:
    body = {"input_ids": [5, 6, 7, 8], "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
    last = None
    async with c.stream("POST", base + "/generate", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                last = json.loads(line[5:])
                first_chunk.set()
    return last


async def test_request_moved_off_an_engine_and_back_completes_and_aborts_by_client_rid():
    async with emulator(*SLOW) as (url, worker):
        # Two attempts: the one the removal ends, and the one on the engine registered again.
        config = _config(dispatch=DispatchConfig(max_attempts=2))
        async with running_router(regular=[url], config=config) as (base, app, store):
            async with httpx.AsyncClient(timeout=120) as c:
                started = [asyncio.Event(), asyncio.Event()]
                runs = [asyncio.ensure_future(_stream(c, base, rid, ev))
                        for rid, ev in zip(("moved-a", "moved-b"), started)]
                for ev in started:
                    await asyncio.wait_for(ev.wait(), 30)
                wid = (await c.get(base + "/workers")).json()["workers"][0]["id"]
                assert (await c.delete(f"{base}/workers/{wid}")).status_code == 202
                await _job_done(c, base, wid)
                r = await c.post(base + "/workers", json={"url": url})
                assert r.status_code == 202, r.text
                await _job_done(c, base, r.json()["worker_id"])
                await asyncio.sleep(2.5)  # past the abort that follows the first streams' end
                r = await c.post(base + "/abort_request", json={"rid": "moved-b"})
                assert r.json()["aborted"] == ["moved-b"]
                done, aborted = await asyncio.wait_for(asyncio.gather(*runs), 60)
                assert done["meta_info"]["finish_reason"] == {"type": "length", "length": LONG}
                assert done["meta_info"]["id"] == "moved-a" and len(done["output_ids"]) == LONG
                assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
                assert aborted["meta_info"]["id"] == "moved-b" and 0 < len(aborted["output_ids"]) < LONG
                # The worker-side attempt of "moved-b" was aborted too, not left running.
                await asyncio.sleep(0.2)
                assert not worker.engine._reqs  # noqa: SLF001 - the emulator's live requests
