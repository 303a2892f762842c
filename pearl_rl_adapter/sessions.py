"""One ``aiohttp.ClientSession`` per event loop.

A session belongs to the loop it was opened on. A trainer driver that calls the async
clients under a fresh ``asyncio.run`` per call would otherwise reuse a session of a
closed loop ("Event loop is closed"). A session of another loop is let go and a new one
opened: nothing of it can be closed from this loop, so it is only marked closed (no
"Unclosed client session" error is logged); the sockets of a loop that is gone close
when they are collected (a ResourceWarning, silent by default).
"""
from __future__ import annotations

import asyncio

import aiohttp


class LoopSession:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._let_go()
            self._session, self._loop = aiohttp.ClientSession(), loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._let_go()

    def _let_go(self) -> None:
        if self._session is not None and not self._session.closed:
            connector = self._session.connector
            self._session.detach()
            if connector is not None and self._loop is not None and self._loop.is_closed():
                connector._close()  # only marks it closed: its loop cannot run anything now
        self._session, self._loop = None, None
