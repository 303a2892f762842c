"""What each worker did during a turn's windows: time-averaged batch, context and prefills
(``router.activity``), on a manual clock and through the router over an emulated worker."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from pearl_sglang.clock import ManualClock
from pearl_sglang.router.activity import TurnWindows, WorkerActivity, between
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import running_router
from tests.support.emulated import emulators


def test_windows_average_the_batch_over_time_and_count_prefills_ahead():
    clock = ManualClock()
    act = WorkerActivity(clock.now)
    a, b = TurnWindows(act), TurnWindows(act)
    a.sent(holder=0)
    b.sent(holder=0)
    clock.advance(1.0)
    a.first_chunk(holder=0, main=0, computed=3000, context=4000, tokens=1)  # a: 1 s of prefill
    clock.advance(2.0)
    b.first_chunk(holder=0, main=0, computed=1000, context=2000, tokens=8)  # b waited behind a
    assert (b.queued_prefill, b.first_chunk_tokens) == (3000, 8)
    assert a.queued_prefill == 0
    clock.advance(1.0)
    # a decoded 3 s: alone for 2 s (4,000 tokens of context), beside b for 1 s (6,000).
    w = a.decode_window()
    assert w.seconds == 3.0
    assert w.sequences == pytest.approx((1 * 2 + 2 * 1) / 3)
    assert w.context_tokens == pytest.approx((4000 * 2 + 6000 * 1) / 3)
    assert w.prefilled == 1000  # b's prefill ran during a's decode
    a.stop()
    clock.advance(1.0)
    assert b.decode_window().sequences == pytest.approx(1.5)  # 1 s beside a, 1 s alone
    b.stop()
    # Nothing decodes now: an idle window is empty, not negative.
    start = act.mark(0)
    clock.advance(5.0)
    assert between(start, act.mark(0)) == (5.0, 0.0, 0.0, 0)


def test_a_moved_request_has_no_decode_window_and_leaves_the_batch():
    clock = ManualClock()
    act = WorkerActivity(clock.now)
    t = TurnWindows(act)
    t.sent(holder=1)
    t.first_chunk(holder=1, main=1, computed=10, context=10, tokens=1)
    clock.advance(1.0)
    t.stop(moved=True)
    t.stop()  # the request's end after the move: counted out once
    assert t.decode_window() is None
    start = act.mark(1)
    clock.advance(1.0)
    assert between(start, act.mark(1)).sequences == 0.0
    # Moved before its first chunk (drained while queued): its decode runs whole on the
    # next worker, so the window stands, and it leaves that batch when it ends.
    u = TurnWindows(act)
    u.sent(holder=1)
    u.stop(moved=True)
    u.sent(holder=2)
    u.first_chunk(holder=2, main=2, computed=10, context=10, tokens=1)
    clock.advance(2.0)
    assert u.decode_window() == (2.0, 1.0, 10.0, 0)
    u.stop()
    start = act.mark(2)
    clock.advance(1.0)
    assert between(start, act.mark(2)).sequences == 0.0


async def test_router_telemetry_sees_the_batch_a_turn_decoded_in():
    """Four turns sent together to one emulated worker decode side by side; one sent alone
    decodes alone. The samples carry that batch (not the count when each was sent: the
    first of the four saw none in flight) and its context tokens."""
    # At 5x a decode iteration lasts 0.4 ms of real time: at 20x (0.1 ms) a slower host's
    # worker ran the whole decode before it sent the first chunk, so that chunk carried
    # every token and the turn had no decode window to sample (2 samples of 4).
    async with emulators(1, "--time-scale", "5") as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u for u, _ in workers]) as (url, app, _):
                async def turn(prompt_id: int) -> None:
                    r = await c.post(url + "/generate", json={
                        "input_ids": [prompt_id] * 300,
                        "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})
                    assert r.status_code == 200, r.text

                await asyncio.gather(*(turn(i) for i in (11, 12, 13, 14)))
                crowded = app[ROUTER].telemetry.drain()
                await turn(15)
                alone = app[ROUTER].telemetry.drain()
    assert len(crowded.decode) == 4 and len(alone.decode) == 1
    assert min(d.concurrency for d in crowded.decode) > 2.5
    assert alone.decode[0].concurrency == pytest.approx(1.0)
    # Each sequence attends over its prompt and what it generated: 300-364 tokens.
    assert 300 <= alone.decode[0].context_tokens <= 364
    # (Every sequence counts its 300-token prompt, so the lower bound is met with equality
    # up to the rounding of two time integrals.)
    assert all(300 * d.concurrency * (1 - 1e-9) <= d.context_tokens <= 364 * d.concurrency for d in crowded.decode)
    # The prefill samples count what finished ahead: together the last of the four waited for
    # the others' 900 prompt tokens at most (the emulator may batch their prefills).
    assert sorted(p.tokens for p in crowded.prefill)[0] >= 300
    assert alone.prefill and alone.prefill[0].tokens == 300
