"""Aborts sent to PEARL instead of to the workers behind it.

Frameworks written for sglang-router abort requests at the workers directly. Behind PEARL
a worker-side abort that PEARL did not order looks like a lost worker: PEARL resubmits the
request elsewhere with its partial output, so the framework never sees it end. An abort
sent to PEARL's ``/abort_request`` instead ends the request where it runs (prefill and
decode alike) and returns its partial output with ``finish_reason`` abort.

The calls go through the adapter's protocol and transport, so they fail as every other
call does: a typed ``PearlError``, ``PearlTimeout`` once ``timeout_s`` is spent.
"""
from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping

import aiohttp

from pearl_rl_adapter import protocol
from pearl_rl_adapter.aio import exchange
from pearl_rl_adapter.config import ClientConfig, is_seconds
from pearl_rl_adapter.errors import PearlTimeout

PATH = "/abort_request"
# One abort round answers at once; a slow one should not use up the whole budget.
ROUND_TIMEOUT_S = 30.0


def _aborted(data: Mapping[str, Any]) -> list[str]:
    aborted = data["aborted"]
    if not isinstance(aborted, list) or not all(isinstance(r, str) for r in aborted):
        raise TypeError(f"aborted is not a list of rids: {aborted!r}")
    return aborted


async def abort_through_router(router_url: str, *, rids: Iterable[str] | None = None, api_key: str | None = None,
                               interval_s: float = 0.2, timeout_s: float = 120.0) -> int:
    """Abort ``rids`` (or everything) at PEARL until none of them is in flight; returns
    how many distinct requests were aborted."""
    if rids is not None:
        if isinstance(rids, (str, bytes)) or not isinstance(rids, Iterable):
            raise ValueError(f"rids must be a list of request ids, got {rids!r}")
        rids = list(rids)
        if not all(isinstance(r, str) and r for r in rids):
            raise ValueError(f"rids must be non-empty strings, got {rids!r}")
    if not (is_seconds(timeout_s) and is_seconds(interval_s)):
        raise ValueError(f"timeout_s and interval_s must be positive numbers of seconds, "
                         f"got {timeout_s!r} and {interval_s!r}")
    cfg = ClientConfig(base_url=router_url, api_key=api_key, backoff_s=())
    cfg.validate()
    bodies = [{"abort_all": True}] if rids is None else [{"rid": rid} for rid in rids]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen: set[str] = set()
    async with aiohttp.ClientSession() as session:
        while bodies:
            left = []
            for body in bodies:
                budget = deadline - loop.time()
                if budget <= 0:
                    raise _spent(timeout_s)
                call = protocol.Call("POST", PATH, body, min(ROUND_TIMEOUT_S, budget), _aborted, admin=False)
                try:
                    aborted = protocol.decode(call, *await exchange(session, cfg, call))
                except PearlTimeout as e:
                    raise _spent(timeout_s) if loop.time() >= deadline else e
                seen.update(aborted)
                if aborted:
                    left.append(body)
            bodies = left
            if bodies:
                await asyncio.sleep(interval_s)
    return len(seen)


def _spent(timeout_s: float) -> PearlTimeout:
    return PearlTimeout(f"requests were still in flight at PEARL after {timeout_s:g}s of aborts",
                        endpoint=f"POST {PATH}")
