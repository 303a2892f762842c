"""Drain and abort are awaitable operations over the in-flight registry: a slot's
``emptied`` event, not a flag looked at again and again."""
from __future__ import annotations

import asyncio

from pearl_sglang.router.inflight import EndCause, InFlightRegistry


async def test_emptied_is_done_when_the_last_request_leaves_the_slot():
    reg = InFlightRegistry()
    a, b = reg.open("a"), reg.open("b")
    reg.assign(a, (1, 2), ("u1", "u2"))
    reg.assign(b, (1,), ("u1",))
    assert reg.emptied(3).done()  # nothing there now
    one, two = reg.emptied(1), reg.emptied(2)
    assert not one.done() and not two.done()
    reg.assign(a, (4,), ("u4",))  # a moves on: slot 2 is empty, slot 1 still holds b
    assert two.done() and not one.done()
    reg.close("b")
    assert one.done()
    four = reg.emptied(4)
    reg.close("a")
    assert four.done() and reg.load() == {}


async def test_a_waiter_that_gave_up_is_skipped():
    reg = InFlightRegistry()
    reg.assign(reg.open("a"), (1,), ("u1",))
    gone, kept = reg.emptied(1), reg.emptied(1)
    gone.cancel()
    reg.close("a")
    assert kept.done() and gone.cancelled()


async def test_a_clients_abort_wins_over_a_move():
    reg = InFlightRegistry()
    a, b = reg.open("a"), reg.open("b")
    reg.end([a], EndCause.MIGRATE)
    reg.end([a, b], EndCause.CLIENT_ABORT)
    reg.end([a, b], EndCause.MIGRATE)
    assert a.cause is b.cause is EndCause.CLIENT_ABORT


async def test_a_move_does_not_override_an_earlier_move_or_nothing():
    reg = InFlightRegistry()
    a = reg.open("a")
    reg.end([a], EndCause.MIGRATE)
    assert a.cause is EndCause.MIGRATE


async def test_emptied_wakes_its_waiter_without_polling():
    reg = InFlightRegistry()
    reg.assign(reg.open("a"), (1,), ("u1",))
    waiter = asyncio.ensure_future(asyncio.wait_for(reg.emptied(1), 5))
    await asyncio.sleep(0)
    assert not waiter.done()
    asyncio.get_running_loop().call_soon(reg.close, "a")
    await waiter  # resolved by the close itself
