"""Move in-flight requests off a worker the control plane is taking away.

The caller first takes the worker out of routing in the state table (LEAVING, SWITCHING or
INACTIVE), then calls ``migrate_off``: every item on it is marked for migration and
aborted there by its exact rid (prefill and decode alike). The dispatcher keeps the
partial output and resubmits it elsewhere, so the drain is an event, not a timed wait.
Proxied OpenAI requests are not movable (no token ids at the router): the drain waits for
them to finish, up to its deadline.
"""
from __future__ import annotations

import asyncio

from pearl_sglang.router.inflight import EndCause
from pearl_sglang.router.state import RouterState


async def migrate_off(st: RouterState, slot: int) -> int:
    """Returns how many items were moved."""
    entries = [e for e in st.inflight.on_slot(slot) if e.movable]
    for entry in entries:
        if entry.cause is None:
            entry.cause = EndCause.MIGRATE
    await abort_entries(st, entries)
    return len(entries)


async def abort_entries(st: RouterState, entries) -> None:
    """Abort each entry on every worker it is on, by the rid that worker knows it by."""
    await asyncio.gather(*(st.workers.abort(url=url, rid=entry.worker_rid)
                           for entry in entries for url in entry.urls))


async def wait_drained(st: RouterState, slot: int, timeout_s: float, resend_s: float = 0.25) -> bool:
    """Wait until no item is on ``slot``; False if the deadline passed first. An abort that
    reaches a worker before the request it names is ignored (the worker does not know the
    rid yet), so aborts are sent again to whatever is still there every ``resend_s``."""
    clock = st.clock
    deadline = clock.now() + timeout_s
    next_resend = clock.now() + resend_s
    while st.inflight.on_slot(slot):
        now = clock.now()
        if now >= deadline:
            return False
        if now >= next_resend:
            await migrate_off(st, slot)
            next_resend = clock.now() + resend_s
        await clock.sleep(0.01)
    return True
