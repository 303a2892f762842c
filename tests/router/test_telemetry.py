"""Telemetry for the runtime profile, observed through the router over emulated workers."""
from __future__ import annotations

import asyncio

import httpx

from pearl_sglang.core.telemetry import fit_step
from pearl_sglang.router.activity import Window
from pearl_sglang.router.state import ROUTER
from pearl_sglang.router.telemetry import TelemetryCollector, TurnObservation
from tests.router.conftest import running_router
from tests.support.emulated import emulators


async def _turns(c, url, prompt, turns, headers_for, env_s=0.2):
    ctx = list(prompt)
    for turn in range(turns):
        r = await c.post(url + "/generate", headers=headers_for(turn), json={
            "input_ids": ctx, "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}})
        assert r.status_code == 200, r.text
        ctx = ctx + r.json()["output_ids"] + [7 + turn] * 100  # the observation
        await asyncio.sleep(env_s)


async def test_turns_are_recorded_with_and_without_trajectory_headers():
    async with emulators(2, "--time-scale", "20") as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u for u, _ in workers]) as (url, app, _):
                await asyncio.gather(
                    _turns(c, url, [11] * 200, 3, lambda t: {"X-Pearl-Trajectory-Id": "traj-a",
                                                             "X-Pearl-Turn": str(t)}),
                    _turns(c, url, [12] * 200, 3, lambda t: {}))
                bad = await c.post(url + "/generate", headers={"X-Pearl-Turn": "x"},
                                   json={"input_ids": [1]})
                step = app[ROUTER].telemetry.drain()
    assert bad.status_code == 400
    by_traj: dict[str, list] = {}
    for t in step.turns:
        by_traj.setdefault(t.trajectory_id, []).append(t)
    assert sorted(len(v) for v in by_traj.values()) == [3, 3]  # the anonymous one was inferred
    a = sorted(by_traj.pop("traj-a"), key=lambda t: t.turn_index)
    anon = sorted(next(iter(by_traj.values())), key=lambda t: t.turn_index)
    for turns in (a, anon):
        assert [t.turn_index for t in turns] == [0, 1, 2]
        assert all(t.generated_tokens == 48 for t in turns)
        assert turns[0].env_time_s == 0 and all(t.env_time_s >= 0.15 for t in turns[1:])
        # Later turns reuse their worker's cache: only the observation (and the
        # response, carried) is computed, never the whole context again.
        assert all(t.new_input_tokens <= 100 + 64 for t in turns[1:])
    est = fit_step(step)
    assert est.S == 3 and est.r == 48
    assert est.theta is not None and est.theta > 0


def test_collector_counts_effective_prefill():
    col = TelemetryCollector()
    base = dict(trajectory="t", key=(), full_key=(), first_chunk_tokens=16)
    col.observe(TurnObservation(turn=0, prompt_tokens=1000, cached_tokens=0, generated_tokens=100,
                                arrived_at=0.0, first_chunk_at=0.5, finished_at=2.0,
                                decode_window=Window(1.5, 4.0, 40_000.0, 0), **base))
    col.observe(TurnObservation(turn=1, prompt_tokens=1900, cached_tokens=1000, generated_tokens=100,
                                arrived_at=5.0, first_chunk_at=5.4, finished_at=7.0, queued_prefill_tokens=600,
                                decode_window=Window(1.6, 6.5, 65_000.0, 420), **base))
    # Moved between workers (no window): no decode or prefill sample, the turn still counts.
    col.observe(TurnObservation(turn=2, prompt_tokens=2100, cached_tokens=2000, generated_tokens=100,
                                arrived_at=9.0, first_chunk_at=9.4, finished_at=11.0, **base))
    step = col.drain()
    first, second, _ = step.turns
    assert first.new_input_tokens == 1000 and second.new_input_tokens == 800  # 900 computed - 100 carried
    assert second.env_time_s == 3.0
    # The decode ran at the window's mean concurrency, between 420 prefill tokens (84 tokens
    # after the first chunk's 16); the first chunk waited for 600 tokens queued ahead.
    assert [(d.concurrency, d.context_tokens, d.prefill_tokens_per_token) for d in step.decode] == [
        (4.0, 40_000.0, 0.0), (6.5, 65_000.0, 5.0)]
    assert [p.tokens for p in step.prefill] == [1000, 900 + 600]
    assert fit_step(step).delta_L == (1000 + 800 + 100 + 0 + 100) / 3
    assert col.pending() == 0


def test_sequence_key_extends_the_prompt_key_without_rehashing_it():
    import random

    from pearl_sglang.router.selection import TOKEN_BLOCK, prefix_key
    from pearl_sglang.router.telemetry import full_sequence_key

    rng = random.Random(7)
    for n in (0, 5, TOKEN_BLOCK - 1, TOKEN_BLOCK, TOKEN_BLOCK + 1, 10 * TOKEN_BLOCK + 3):
        for m in (0, 1, TOKEN_BLOCK, 2 * TOKEN_BLOCK + 5):
            prompt = [rng.randrange(1000) for _ in range(n)]
            output = [rng.randrange(1000) for _ in range(m)]
            whole = prefix_key(prompt + output, None)  # full blocks only
            assert full_sequence_key(prompt, output) == whole
            assert full_sequence_key(prompt, output, prefix_key(prompt, None)) == whole
            # the next turn's prompt starts with this sequence, so it shares these blocks
            assert prefix_key(prompt + output + [1] * TOKEN_BLOCK, None)[:len(whole)] == whole


def test_an_expected_turn_count_is_kept_with_the_trajectory_and_never_keeps_it_alive():
    col = TelemetryCollector(idle_s=30.0)
    col.expect_turns("a", 12, now=100.0)   # before its first turn is sent
    col.turn_began("a", 100.0)
    col.expect_turns("a", 14, now=101.0)   # the latest word counts
    [p] = col.progress(101.0)
    assert (p.trajectory_id, p.expected_turns) == ("a", 14)
    col.expect_turns("ghost", 5, now=100.0)  # a hint whose turn never comes
    assert set(col.live(129.0)) == {"a", "ghost"} and set(col.live(131.0)) == {"a"}
    col.drain()
    assert col.progress(131.0) == ()
