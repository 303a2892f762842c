"""Workers that die or fail under a request: a worker process SIGKILLed mid-stream (real
SGLang and the emulator), and a prefill that fails while its decode waits for KV. The
request completes elsewhere token for token, or ends with a bounded error; a waiting
decode is always freed, never left to its own (minutes-long) bootstrap timeout."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from benchmarks.harness.servers import wait_all_healthy
from pearl_sglang.control.processes import free_port
from pearl_sglang.core.state import Role
from pearl_sglang.router.state import ROUTER
from tests.support.fault_proxy import Fault, FaultProxy
from tests.faults.support import assert_continuous, collect_sse, fault_config, long_body, reference
from tests.router.conftest import running_router
from tests.support.emulated import emulator
from tests.support.workers import WorkerLauncher

KINDS = [pytest.param("emulator", marks=pytest.mark.timeout(30)),
         pytest.param("sglang", marks=[pytest.mark.realsglang, pytest.mark.timeout(300)])]


PROMPTS = {"ids": {"input_ids": [17, 29, 31, 37, 41]},
           # A text prompt can move only once the router knows its token ids: it asks the
           # worker for them (return_prompt_token_ids) with the first attempt.
           "text": {"text": "The quick brown fox jumps over the lazy dog"}}


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("kind", KINDS)
async def test_worker_sigkilled_mid_stream_completes_elsewhere_token_exact(kind, prompt, worker_sets,
                                                                         tiny_model_dir, tmp_path):
    """Real SGLang needs minutes to start a second server on CPU: that case has its own
    timeout; the emulator case is the one CI runs on every change."""
    survivor, _ = worker_sets(kind)
    body = {**PROMPTS[prompt], "sampling_params": {"temperature": 0, "max_new_tokens": 600, "ignore_eos": True}}
    launcher = WorkerLauncher(kind, tmp_path)
    victim = launcher.start("victim", tiny_model_dir, Role.COLOCATED)
    try:
        async with httpx.AsyncClient(timeout=120) as c:  # while the victim starts
            expected = (await c.post(survivor.url + "/generate", json=body)).json()
        await asyncio.to_thread(wait_all_healthy, [victim], 240)
        # The victim is slot 0, so an idle router sends the first attempt there.
        async with running_router(regular=[victim.url, survivor.url],
                                  config=fault_config(chunk_s=30.0)) as (url, app, _):
            killed_at: list[int] = []

            def kill(chunk):
                if len(chunk["output_ids"]) >= 20 and not killed_at:
                    killed_at.append(len(chunk["output_ids"]))
                    victim.kill()

            async with httpx.AsyncClient(timeout=120) as c:
                events = await collect_sse(c, url + "/generate", body, on_chunk=kill)
            assert len(app[ROUTER].inflight) == 0
    finally:
        launcher.stop_all()
    chunks = assert_continuous(events)
    assert killed_at and killed_at[0] < 600
    assert chunks[-1]["output_ids"] == expected["output_ids"]
    assert chunks[-1]["meta_info"]["pearl_attempts"] >= 2
    assert chunks[-1]["meta_info"]["completion_tokens"] == 600


PD = ("--disaggregation-transfer-backend", "mooncake", "--time-scale", "5", "--disable-radix-cache")


def _decode_idle(worker) -> bool:
    s = worker.engine.loads()
    return not (s.num_running_reqs or s.num_waiting_reqs or s.decode_prealloc_queue_reqs
                or s.decode_transfer_queue_reqs)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", [Fault.RESET, Fault.HANG])
async def test_failed_prefill_frees_its_waiting_decode_and_retries_on_another_prefill(fault):
    body = long_body([5, 10, 15, 20, 25, 30, 35], 40)
    expected = await reference(body)
    b1, b2, bd = free_port(), free_port(), free_port()
    async with emulator(*PD, "--disaggregation-mode", "prefill", bootstrap_port=b1) as (p1, _), \
            emulator(*PD, "--disaggregation-mode", "prefill", bootstrap_port=b2) as (p2, _), \
            emulator(*PD, "--disaggregation-mode", "decode", bootstrap_port=bd) as (d, dw), \
            FaultProxy.to(p1) as proxy:
        proxy.set(fault)
        # Only the prefill's HTTP API is faulty; its bootstrap port answers the decode.
        async with running_router(prefill=[(proxy.url, b1), (p2, b2)], decode=[d],
                                  config=fault_config(chunk_s=1.0)) as (url, app, _):
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(url + "/generate", json={**body, "rid": "pd-fault"})
            assert len(app[ROUTER].inflight) == 0
            idle = _decode_idle(dw)
    assert proxy.accepted >= 1
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == expected["output_ids"]
    assert r.json()["meta_info"]["pearl_attempts"] == 2
    assert idle, "the decode still holds the first attempt, waiting for KV that never comes"


@pytest.mark.timeout(30)
async def test_failed_only_prefill_is_a_bounded_error_and_frees_the_decode():
    b1, bd = free_port(), free_port()
    async with emulator(*PD, "--disaggregation-mode", "prefill", bootstrap_port=b1) as (p1, _), \
            emulator(*PD, "--disaggregation-mode", "decode", bootstrap_port=bd) as (d, dw), \
            FaultProxy.to(p1) as proxy:
        proxy.set(Fault.RESET)
        async with running_router(prefill=[(proxy.url, b1)], decode=[d],
                                  config=fault_config(chunk_s=1.0, max_attempts=2)) as (url, app, _):
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(url + "/generate", json={**long_body([1, 2, 3], 40), "stream": True})
            elapsed = loop.time() - started
            # The decode's abort is sent before the attempt ends; give its event loop a turn.
            await asyncio.sleep(0)
            idle = _decode_idle(dw)
    assert elapsed < 5, elapsed
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_failed", r.text
    assert idle


@pytest.mark.timeout(30)
async def test_a_request_the_worker_fails_does_not_take_the_worker_out_for_others():
    config = fault_config(route_wait_s=2.0)
    async with emulator("--time-scale", "20") as (u0, w0):
        submit = w0.engine.submit

        def crash_on_poison(req, **kw):
            if tuple(req.input_ids) == (666, 666):
                raise RuntimeError("injected: the scheduler crashed on this request")
            return submit(req, **kw)
        w0.engine.submit = crash_on_poison  # the worker answers 500 to that request only
        async with running_router(regular=[u0], config=config) as (url, app, _):
            async with httpx.AsyncClient(timeout=30) as c:
                poison = await c.post(url + "/generate", json=long_body([666, 666], 4))
                after = await c.post(url + "/generate", json=long_body([1, 2, 3], 4))
    assert poison.status_code == 502, poison.text
    assert after.status_code == 200, after.text
