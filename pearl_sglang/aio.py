"""Asyncio helpers shared by the shells."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable


def retrieve_outcome(future: asyncio.Future) -> None:
    """A done callback that consumes a future's exception, for a future no one may await."""
    if not future.cancelled():
        future.exception()


async def gather_settled(*aws: Awaitable[Any]) -> list[Any]:
    """``gather(..., return_exceptions=True)`` that, when the caller is cancelled, still
    consumes the gather's outcome (asyncio would otherwise log "exception was never
    retrieved" for the CancelledError it stores)."""
    gathered = asyncio.gather(*aws, return_exceptions=True)
    gathered.add_done_callback(retrieve_outcome)
    return await gathered


async def cancel_all(tasks: list[asyncio.Future]) -> None:
    """Cancel ``tasks`` and wait until each has ended."""
    for task in tasks:
        task.cancel()
    await gather_settled(*tasks)
