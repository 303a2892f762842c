"""Asyncio helpers shared by the shells."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable


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


@contextlib.asynccontextmanager
async def cancelled_at_exit(tasks: list[asyncio.Future]) -> AsyncIterator[list[asyncio.Future]]:
    """A block whose end cancels ``tasks`` (those added to it by then) and waits for them."""
    try:
        yield tasks
    finally:
        await cancel_all(tasks)


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` in a task that was asked to cancel and runs on: on Python
    3.11 ``asyncio.wait_for`` returns its inner result, swallowing the cancellation, when
    the two arrive together. Call it before waiting for something the canceller may hold
    (a lock): the task would otherwise wait for it forever, and its canceller for the task."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
