"""Notice clients that hang up while their non-streaming request runs.

aiohttp does not cancel a handler when its client disconnects (the router runs without
``handler_cancellation``: an admin call must finish what it started). A non-streaming
``/generate`` writes nothing until the end, so nothing else would notice that its client
left, and the worker would generate to the end for nobody. One periodic task checks the
watched requests' connections and cancels the handlers whose client is gone; the
dispatcher then aborts the request at its worker. One timer for all requests, not one
per request: cheap on the replay harness's virtual clock too.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Iterator

from aiohttp import web


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class ClientWatch:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._watched: dict[asyncio.Task, web.Request] = {}
        self._wake = asyncio.Event()
        self.cancelled = 0

    @contextlib.contextmanager
    def watching(self, request: web.Request) -> Iterator[None]:
        task = asyncio.current_task()
        self._watched[task] = request
        self._wake.set()
        try:
            yield
        finally:
            self._watched.pop(task, None)

    async def run(self) -> None:
        while True:
            if not self._watched:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(self.interval_s)
            for task, request in list(self._watched.items()):
                if client_gone(request):
                    del self._watched[task]
                    self.cancelled += 1
                    task.cancel()
