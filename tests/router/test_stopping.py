"""Stopping the router: requests in flight finish within the grace or answer with their
output so far; waiting registrations answer 503; nothing waits for aiohttp's 60 s."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx
import pytest

from pearl_sglang.control.attach import attached_table
from pearl_sglang.control.processes import free_port
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.connections import start_site
from pearl_sglang.router.state import ROUTER
from pearl_sglang.server.compose import build_app
from pearl_sglang.server.stopping import stop_serving
from pearl_sglang.state_store import StateStore
from tests.support.emulated import emulator
from tests.support.router_process import wait_answering

SLOW = ("--time-scale", "1")  # ~4 ms a token: 8,000 tokens take half a minute
DEAD_WORKER = "http://127.0.0.1:9"  # discard port: nothing listens there


def _gen(n: int) -> dict:
    return {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}


async def _in_flight(app, count: int) -> None:
    for _ in range(400):
        if len(app[ROUTER].inflight) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} requests never became in flight")


async def test_stop_lets_short_requests_finish_and_aborts_long_ones_with_their_output():
    async with emulator(*SLOW) as (worker, _):
        url, app, _, runner = await _serving(worker)
        async with httpx.AsyncClient(timeout=60) as c:
            long = asyncio.ensure_future(c.post(url + "/generate", json=_gen(8000)))
            streamed = asyncio.ensure_future(c.post(url + "/generate", json={**_gen(8000), "stream": True}))
            short = asyncio.ensure_future(c.post(url + "/generate", json=_gen(50)))
            chat = asyncio.ensure_future(c.post(url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6000, "ignore_eos": True}))
            await _in_flight(app, 4)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await stop_serving(runner, grace_s=1.5)
            took = loop.time() - started
            done = (await short).json()
            assert done["meta_info"]["finish_reason"]["type"] == "length" and len(done["output_ids"]) == 50
            cut = (await long).json()
            assert cut["meta_info"]["finish_reason"]["type"] == "abort"
            assert 0 < len(cut["output_ids"]) < 8000
            answer = (await chat).json()
            assert answer["choices"][0]["finish_reason"] == "abort" and 0 < answer["usage"]["completion_tokens"] < 6000
            events = [line for line in (await streamed).text.splitlines() if line.startswith("data: {")]
            assert '"abort"' in events[-1] and (await streamed).text.rstrip().endswith("data: [DONE]")
            assert 1.5 <= took < 5, took
            assert len(app[ROUTER].inflight) == 0
            with pytest.raises(httpx.ConnectError):
                await c.post(url + "/generate", json=_gen(1))


async def _serving(worker: str):
    """A router in this process over ``worker``, its runner left to the caller to stop."""
    store = StateStore(attached_table(regular=(worker,)))
    app = build_app(RouterConfig(health_interval_s=3600), store)
    runner, port = await start_site(app, app[ROUTER].connections, "127.0.0.1", 0, close_s=5)
    return f"http://127.0.0.1:{port}", app, store, runner


async def test_stop_answers_requests_held_at_the_gate_with_abort():
    # Found by fuzzing: requests held by /pause_generation were not in flight yet, so a
    # stop closed their connections without an answer.
    async with emulator(*SLOW) as (worker, _):
        url, app, _, runner = await _serving(worker)
        async with httpx.AsyncClient(timeout=60) as c:
            await c.post(url + "/pause_generation", json={})
            held = [asyncio.ensure_future(c.post(url + "/generate", json=_gen(50))) for _ in range(3)]
            await _in_flight(app, 3)
            loop = asyncio.get_running_loop()
            started = loop.time()
            # Paused, they cannot run before the router is gone: no grace is waited out.
            await stop_serving(runner, grace_s=30)
            answers = [(await h).json() for h in held]
            assert loop.time() - started < 3
    assert [a["meta_info"]["finish_reason"]["type"] for a in answers] == ["abort"] * 3
    assert all(a["output_ids"] == [] for a in answers)


async def test_an_abort_reaches_requests_held_at_the_gate_or_waiting_for_a_route():
    # Found by fuzzing: an abort_all (or a pause) during a reconfiguration listed requests
    # still waiting for a worker as aborted, and they were sent and ran to their end.
    from pearl_sglang.core.events import GpusLeave

    async with emulator(*SLOW) as (worker, _):
        url, app, store, runner = await _serving(worker)
        try:
            async with httpx.AsyncClient(timeout=60) as c:
                await store.apply([GpusLeave(store.table.worker(0).gpus)])  # nothing routable
                waiting = asyncio.ensure_future(c.post(url + "/generate", json={**_gen(50), "rid": "w"}))
                await _in_flight(app, 1)
                await asyncio.sleep(0.3)  # in the route's wait
                async with app[ROUTER].gate.closed("a test's reconfiguration"):
                    held = asyncio.ensure_future(c.post(url + "/generate", json={**_gen(50), "rid": "h"}))
                    await _in_flight(app, 2)
                    loop = asyncio.get_running_loop()
                    started = loop.time()
                    r = await c.post(url + "/abort_request", json={"abort_all": True})
                    assert sorted(r.json()["aborted"]) == ["h", "w"]
                    answers = [(await asyncio.wait_for(t, 5)).json() for t in (waiting, held)]
                    assert loop.time() - started < 2
            assert [a["meta_info"]["finish_reason"]["type"] for a in answers] == ["abort"] * 2
            assert all(a["output_ids"] == [] for a in answers) and len(app[ROUTER].inflight) == 0
        finally:
            await runner.cleanup()


async def test_stop_answers_a_waiting_legacy_registration_with_503_at_once():
    app = build_app(RouterConfig(health_interval_s=3600), StateStore(attached_table()))
    runner, port = await start_site(app, app[ROUTER].connections, "127.0.0.1", 0, close_s=5)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=60) as c:
        # Nothing listens there: the registration waits for the worker's health.
        pending = asyncio.ensure_future(c.post(url + "/add_worker", params={"url": DEAD_WORKER}))
        await asyncio.sleep(0.5)
        assert not pending.done()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await stop_serving(runner, grace_s=30)
        r = await pending
        assert loop.time() - started < 3
        assert r.status_code == 503 and "stopping" in r.json()["error"]["message"], r.text


async def test_sigterm_stops_the_router_process_within_its_grace():
    port = free_port()
    async with emulator(*SLOW) as (worker, _), httpx.AsyncClient(timeout=60) as c:
        proc = subprocess.Popen([sys.executable, "-m", "pearl_sglang.router", "--port", str(port),
                                 "--worker-urls", worker, "--shutdown-grace-s", "1", "--log-level", "WARNING"],
                                env=dict(os.environ), stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            await wait_answering(c, base + "/health", proc)
            loop = asyncio.get_running_loop()
            long = asyncio.ensure_future(c.post(base + "/generate", json=_gen(8000)))
            registering = asyncio.ensure_future(c.post(base + "/add_worker", params={"url": DEAD_WORKER}))
            await asyncio.sleep(1.0)
            started = loop.time()
            proc.send_signal(signal.SIGTERM)
            while proc.poll() is None and loop.time() - started < 20:
                await asyncio.sleep(0.1)
            took = loop.time() - started
            assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
            assert took < 8, took
            cut = (await long).json()
            assert cut["meta_info"]["finish_reason"]["type"] == "abort" and cut["output_ids"]
            assert (await registering).status_code == 503
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(20)
