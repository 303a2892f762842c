"""A hung worker is not waited on: a SIGSTOPped worker's streams stall, the router takes it
out of routing at the first stall and moves every request it held elsewhere token for
token; new requests go to the live worker at once. Real SGLang and the emulator."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from benchmarks.harness.servers import wait_all_healthy
from pearl_sglang.core.state import Role
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.stall import DEFAULT_STALL_S, stall_bound_s
from pearl_sglang.router.state import ROUTER
from tests.faults.support import assert_continuous, collect_sse, fault_config, until
from tests.router.conftest import ADMIN_TOKEN, running_router
from tests.support.workers import WorkerLauncher

# (kind, stall bound, tokens per request): real SGLang on two loaded CPU cores has a longer
# stall bound. The streams must still run when the victim stops, right after they reach it.
KINDS = [pytest.param("emulator", 2.0, 500, marks=pytest.mark.timeout(120)),
         pytest.param("sglang", 6.0, 600, marks=[pytest.mark.realsglang, pytest.mark.timeout(900)])]


def _body(seed: int, tokens: int) -> dict:
    return {"input_ids": [11 + seed, 23, 31, 47, 53],
            "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}}


def _running(url: str) -> int:
    loads = httpx.get(url + "/v1/loads", timeout=5).json()["loads"]
    return sum(x["num_running_reqs"] for x in loads)


@pytest.mark.parametrize("kind,stall_s,tokens", KINDS)
async def test_a_stopped_worker_is_taken_out_and_its_requests_move(kind, stall_s, tokens, worker_sets,
                                                                   tiny_model_dir, tmp_path):
    survivor, _ = worker_sets(kind)
    launcher = WorkerLauncher(kind, tmp_path)
    victim = launcher.start("victim", tiny_model_dir, Role.COLOCATED)
    stopped = False
    try:
        # The survivor computes the expected outputs while the victim starts.
        async with httpx.AsyncClient(timeout=300) as c:
            replies = await asyncio.gather(*(c.post(survivor.url + "/generate", json=_body(i, tokens))
                                             for i in range(4)))
            expected = [r.json()["output_ids"] for r in replies]
        await asyncio.to_thread(wait_all_healthy, [victim], 240)
        # The streams start while the victim is the router's only worker, so they run there
        # whatever placement would prefer. The victim stops before the survivor joins: a
        # stopped worker cannot finish its streams before the join, however fast the machine
        # (twice in CI a running one did), and requests moved before the join ends wait for
        # the arriving worker.
        async with running_router(regular=[victim.url],
                                  config=fault_config(chunk_s=stall_s, breaker_cooldown_s=600)) as (url, app, store):
            victim_slot = next(w.slot for w in store.table.active() if w.endpoint == victim.url)
            async with httpx.AsyncClient(timeout=300) as c:
                streams = [asyncio.ensure_future(collect_sse(c, url + "/generate", _body(i, tokens)))
                           for i in range(4)]
                deadline = time.monotonic() + 60
                while not await asyncio.to_thread(_running, victim.url):
                    assert time.monotonic() < deadline, "no request reached the victim"
                    await asyncio.sleep(0.05)
                os.kill(victim.pid, signal.SIGSTOP)
                stopped = True
                stopped_at = time.monotonic()
                assert not any(s.done() for s in streams), "the streams ended before the stop"
                r = await c.post(url + "/workers", json={"url": survivor.url},
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                assert r.status_code == 202, r.text
                await until(lambda: any(w.endpoint == survivor.url for w in store.table.active()),
                            timeout=120, what="the survivor to join")
                while victim_slot not in app[ROUTER].breakers.open_slots():
                    assert time.monotonic() - stopped_at < stall_s + 30, "the stall was never detected"
                    await asyncio.sleep(0.05)
                opened_within = time.monotonic() - stopped_at
                results = await asyncio.gather(*streams)
                assert victim_slot in app[ROUTER].breakers.open_slots()
                started = time.monotonic()
                fresh = await asyncio.gather(*(c.post(url + "/generate", json={
                    "input_ids": [1, 2, 3 + i], "sampling_params": {"max_new_tokens": 4}}) for i in range(6)))
                fresh_s = time.monotonic() - started
            assert len(app[ROUTER].inflight) == 0
    finally:
        if stopped:
            os.kill(victim.pid, signal.SIGCONT)
        launcher.stop_all()
    for events, want in zip(results, expected):
        assert assert_continuous(events)[-1]["output_ids"] == want
    assert any(assert_continuous(e)[-1]["meta_info"].get("pearl_attempts", 1) >= 2 for e in results)
    # The stall bound plus scheduling noise on two loaded cores.
    assert opened_within < stall_s + 15, opened_within
    assert [r.status_code for r in fresh] == [200] * 6
    assert fresh_s < stall_s, f"a new request waited on the stopped worker ({fresh_s:.1f}s)"


def test_stall_bound_follows_the_profile():
    from pearl_sglang.core.profile import Profile

    profile = Profile(B=64, S=30, delta_L=1000, r=300, theta=1.0, A=0.0045, b=2.0e-5, t_prefill=1e-4, K=1.0,
                      BW=1.0, T_over=0.0, T_env=0.0, K_seq=1.0, H_max=1.0)
    # Prefill of the whole context (30 turns x 1000 tokens at 0.1 ms) dominates: 3 s, x10.
    assert stall_bound_s(profile, 16) == pytest.approx(30.0)
    assert stall_bound_s(profile, 16, time_scale=50) == 5.0  # the floor
    assert stall_bound_s(None, 16) == DEFAULT_STALL_S


def test_stall_bound_is_a_router_flag():
    import argparse
    parser = argparse.ArgumentParser()
    RouterConfig.add_cli_args(parser)
    assert RouterConfig.from_cli_args(parser.parse_args(["--stall-s", "7"])).timeouts.chunk_s == 7
    assert RouterConfig.from_cli_args(parser.parse_args([])).timeouts.chunk_s == DEFAULT_STALL_S
