"""Admin calls that act once: a retried ``request_id`` gets the first call's answer.

A retry that arrives while the first call still runs waits for that same call; a call
that failed is forgotten, so its retry acts. Only the last ``keep`` ids are remembered.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Awaitable, Callable


class OnceByRequestId:
    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self._answers: OrderedDict[str, asyncio.Future] = OrderedDict()

    async def run(self, request_id: str | None, fn: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        if request_id is None:
            return await fn()
        if request_id in self._answers:
            return {**(await asyncio.shield(self._answers[request_id])), "duplicate": True}
        future = asyncio.ensure_future(fn())
        self._answers[request_id] = future
        while len(self._answers) > self.keep:
            self._answers.popitem(last=False)
        try:
            return {**(await asyncio.shield(future)), "duplicate": False}
        except BaseException:
            self._answers.pop(request_id, None)
            raise
