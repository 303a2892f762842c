"""Drain a worker and abort requests: awaitable operations over the in-flight registry.

A drain moves in-flight requests off a worker the control plane is taking away. The
caller first takes the worker out of routing in the state table (LEAVING, SWITCHING or
INACTIVE), then ``drain``s it: every item on it is marked for migration and aborted there
by its exact rid (prefill and decode alike); the dispatcher keeps the partial output and
resubmits it elsewhere, and the drain returns when the registry says the slot is empty
(its ``emptied`` event) or at its deadline. Proxied OpenAI requests are not movable (no
token ids at the router): the drain waits for them to finish, up to its deadline.

A client's ``abort`` ends the items it names with their partial output.
"""
from __future__ import annotations

import asyncio

from pearl_sglang.router.inflight import EndCause, InFlight
from pearl_sglang.router.state import RouterState


async def drain(st: RouterState, slot: int, timeout_s: float, resend_s: float = 0.25) -> bool:
    """Move every movable request off ``slot`` and wait, up to ``timeout_s``, until no
    request is on it; False if the deadline passed first."""
    await migrate_off(st, slot)
    return await wait_drained(st, slot, timeout_s, resend_s)


async def migrate_off(st: RouterState, slot: int) -> int:
    """Returns how many items were moved."""
    entries = [e for e in st.inflight.on_slot(slot) if e.movable]
    st.inflight.end(entries, EndCause.MIGRATE)
    await abort_entries(st, entries)
    return len(entries)


async def abort(st: RouterState, entries: list[InFlight]) -> None:
    """A client's abort: each entry finishes with the output it has so far (one its
    workers do not know by rid is stopped by the router: ``InFlight.aborted``)."""
    st.inflight.end(entries, EndCause.CLIENT_ABORT)
    await abort_entries(st, entries)


async def abort_entries(st: RouterState, entries: list[InFlight]) -> None:
    """Abort each entry on every worker it is on, by the rid that worker knows it by."""
    await asyncio.gather(*(st.workers.abort(url=url, rid=entry.worker_rid)
                           for entry in entries for url in entry.urls))


async def wait_drained(st: RouterState, slot: int, timeout_s: float, resend_s: float = 0.25) -> bool:
    """Wait until no item is on ``slot`` (the registry's ``emptied`` event); False if the
    deadline passed first. An abort that reaches a worker before the request it names is
    ignored (the worker does not know the rid yet), so aborts are sent again to whatever is
    still there every ``resend_s``."""
    clock = st.clock
    deadline = clock.now() + timeout_s
    emptied = st.inflight.emptied(slot)
    try:
        while not emptied.done():
            left = deadline - clock.now()
            if left <= 0:
                return False
            tick = asyncio.ensure_future(clock.sleep(min(resend_s, left)))
            await asyncio.wait((emptied, tick), return_when=asyncio.FIRST_COMPLETED)
            tick.cancel()
            if not emptied.done() and clock.now() < deadline:
                await migrate_off(st, slot)
        return True
    finally:
        emptied.cancel()  # no longer waited for (a no-op once done)
