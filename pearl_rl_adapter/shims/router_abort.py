"""Aborts sent to PEARL instead of to the workers behind it.

Frameworks written for sglang-router abort requests at the workers directly. Behind PEARL
a worker-side abort that PEARL did not order looks like a lost worker: PEARL resubmits the
request elsewhere with its partial output, so the framework never sees it end. An abort
sent to PEARL's ``/abort_request`` instead ends the request where it runs (prefill and
decode alike) and returns its partial output with ``finish_reason`` abort.
"""
from __future__ import annotations

import asyncio
from typing import Iterable


async def abort_through_router(router_url: str, *, rids: Iterable[str] | None = None, api_key: str | None = None,
                               interval_s: float = 0.2, timeout_s: float = 120.0) -> int:
    """Abort ``rids`` (or everything) at PEARL until none of them is in flight; returns
    how many distinct requests were aborted."""
    import aiohttp

    bodies = [{"abort_all": True}] if rids is None else [{"rid": rid} for rid in rids]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: set[str] = set()
    async with aiohttp.ClientSession(headers=headers) as session:
        while bodies:
            left = []
            for body in bodies:
                async with session.post(router_url.rstrip("/") + "/abort_request", json=body,
                                        timeout=aiohttp.ClientTimeout(total=30)) as r:
                    r.raise_for_status()
                    aborted = (await r.json())["aborted"]
                seen.update(aborted)
                if aborted:
                    left.append(body)
            bodies = left
            if bodies and loop.time() > deadline:
                raise TimeoutError(f"requests were still in flight at PEARL after {timeout_s:.0f}s of aborts")
            if bodies:
                await asyncio.sleep(interval_s)
    return len(seen)
