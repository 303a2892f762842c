"""Workers' own load, read periodically for placement (``LoadModel.report``).

The router counts only its own requests; a worker shared with other clients (another
router, a direct evaluation job) is busier than that. Every ``interval_s`` each active
worker is asked for its running + waiting requests: SGLang's ``/v1/loads`` (what 0.5.x
serves, and the emulator), else the older ``/get_load``. A worker that answers neither
is simply not reported, and placement uses the router's own counts for it.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from pearl_sglang.state_store import StateStore
from pearl_sglang.router.load import LoadModel


def requests_in(body: Any) -> int | None:
    """Running + waiting requests from a ``/v1/loads`` or ``/get_load`` answer."""
    if isinstance(body, dict) and isinstance(body.get("loads"), list):
        items = body["loads"]
        keys = ("num_running_reqs", "num_waiting_reqs")
    elif isinstance(body, list):
        items = body
        keys = ("num_reqs", "num_waiting_reqs")
    else:
        return None
    total, seen = 0, False
    for item in items:
        if not isinstance(item, dict):
            continue
        for k in keys:
            v = item.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                total, seen = total + v, True
    return total if seen else None


async def _read(session: aiohttp.ClientSession, endpoint: str, timeout_s: float) -> int | None:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    for path in ("/v1/loads?include=core", "/get_load"):
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ValueError):
            async with session.get(endpoint + path, timeout=timeout) as resp:
                if resp.status == 200:
                    n = requests_in(await resp.json(content_type=None))
                    if n is not None:
                        return n
    return None


async def load_probe_loop(session: aiohttp.ClientSession, store: StateStore, loads: LoadModel,
                          interval_s: float, timeout_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        workers = [w for w in store.table.active() if w.endpoint]
        own = dict(loads.inflight.load())  # a copy: the registry updates its own dict
        counts = await asyncio.gather(*(_read(session, w.endpoint, timeout_s) for w in workers))
        now = loop.time()
        for w, n in zip(workers, counts):
            if n is not None:
                loads.report(w.slot, n, now, own_when_asked=own.get(w.slot, 0))
            else:
                loads.forget(w.slot)
