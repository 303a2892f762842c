"""Admin calls that act once: a retried ``request_id`` gets the first call's answer.

Ids are scoped to one operation (``train_begin``, ``update_weights``, ...): the same id on
another endpoint is another call. A retry must carry the same parameters as the first
call; the same id with different parameters is a client bug (a reused or colliding id)
and is refused with ``RequestIdReused`` rather than answered with an unrelated result.
A retry that arrives while the first call still runs waits for that same call, also when
the first caller stopped waiting (a 504 at its deadline: the call goes on); a call that
failed is forgotten, so its retry acts. Only the last ``keep`` ids are remembered. A call
without an id goes on too when its caller stops waiting: a reconfiguration cut half-way
would leave the table between two states.
"""
from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any, Awaitable, Callable

from pearl_sglang.aio import retrieve_outcome


class RequestIdReused(ValueError):
    """The ``request_id`` of an earlier call of the same operation came with other parameters."""


def _fingerprint(params: Any) -> str:
    return json.dumps(params, sort_keys=True, default=repr)


class OnceByRequestId:
    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self._answers: OrderedDict[tuple[str, str], tuple[str, asyncio.Future]] = OrderedDict()

    async def run(self, operation: str, request_id: str | None, params: Any,
                  fn: Callable[[], Awaitable[dict[str, Any]]], *, remember: bool = True) -> dict[str, Any]:
        """Run ``fn`` once per (``operation``, ``request_id``); ``params`` are what a retry
        must repeat (JSON-like values). ``remember`` false: the id names the call only while
        it runs (a later call with it acts again)."""
        if request_id is None:
            work = asyncio.ensure_future(fn())
            work.add_done_callback(retrieve_outcome)  # its caller may have stopped waiting
            return await asyncio.shield(work)
        key, fingerprint = (operation, request_id), _fingerprint(params)
        if key in self._answers:
            first, future = self._answers[key]
            if first != fingerprint:
                raise RequestIdReused(f"request_id {request_id!r} was already used for a {operation} call "
                                      f"with other parameters ({first}); use a new id for a new call")
            return {**(await asyncio.shield(future)), "duplicate": True}
        future = asyncio.ensure_future(fn())
        self._answers[key] = (fingerprint, future)
        future.add_done_callback(lambda done: self._forget(key, done, always=not remember))
        while len(self._answers) > self.keep:
            self._answers.popitem(last=False)
        return {**(await asyncio.shield(future)), "duplicate": False}

    def _forget(self, key: tuple[str, str], done: asyncio.Future, *, always: bool = False) -> None:
        """A call that failed (or any, with ``always``) is forgotten so its retry acts. A
        caller that stopped waiting (its HTTP deadline passed, the client left) is not a
        failure: the call goes on, and a retry with the same id waits for it instead of
        acting a second time."""
        failed = done.cancelled() or done.exception() is not None
        if (always or failed) and self._answers.get(key, (None, None))[1] is done:
            del self._answers[key]
