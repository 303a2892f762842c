"""A PD request moved while its decode still waits for the KV transfer: SGLang's decode
answers PEARL's abort there with status 500 ("Decode transfer failed ... Aborted by
AbortReq", the emulator does the same), and the router must take it as the move it
caused, resubmit it and complete it, not hand the client an aborted request."""
from __future__ import annotations

import asyncio

import httpx

from pearl_sglang.control.processes import free_port
from pearl_sglang.router.drain import migrate_off
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import running_router
from tests.support.emulated import emulator

FLAGS = ("--time-scale", "5")


async def test_a_request_moved_while_its_decode_awaits_the_kv_completes_elsewhere():
    port = free_port()
    async with emulator("--disaggregation-mode", "prefill", *FLAGS, bootstrap_port=port) as (p, _), \
            emulator("--disaggregation-mode", "decode", *FLAGS) as (d1, w1), \
            emulator("--disaggregation-mode", "decode", *FLAGS) as (d2, w2), \
            httpx.AsyncClient(timeout=60) as c:
        async with running_router(prefill=[(p, port)], decode=[d1, d2]) as (url, app, store):
            # The prefill holds new requests, so the decode waits for their KV.
            r = await c.post(p + "/pause_generation", json={"mode": "in_place"})
            assert r.status_code == 200, r.text
            task = asyncio.ensure_future(c.post(url + "/generate", json={
                "input_ids": [3, 1, 4, 1, 5], "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}))
            waiting = None
            for _ in range(500):
                waiting = next((w for w in (w1, w2) if w.engine._await_kv), None)  # noqa: SLF001
                if waiting is not None:
                    break
                await asyncio.sleep(0.01)
            assert waiting is not None, "the request never reached a decode's KV wait"
            slot = next(w.slot for w in store.table.rollout_workers()
                        if w.endpoint == (d1 if waiting is w1 else d2))
            assert await migrate_off(app[ROUTER], slot) == 1
            await asyncio.sleep(0.2)
            await c.post(p + "/continue_generation", json={})
            out = (await task).json()
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 16}, out["meta_info"]
    assert len(out["output_ids"]) == 16 and out["meta_info"]["pearl_attempts"] == 2
