"""One ``aiohttp.ClientSession`` per event loop, for a client used from several loops.

A session belongs to the loop it was opened on. A trainer driver that calls the async
clients under a fresh ``asyncio.run`` per call, or from threads that each run a loop,
gets a session of its own loop on each: reusing another loop's session fails ("Event
loop is closed", or aiohttp's internals crossing loops). Sessions of loops that are gone
are let go: nothing of them can be closed any more, so they are only marked closed (no
"Unclosed client session" error is logged); their sockets close when collected.
``close()`` closes every session: its own loop's at once, a running other loop's on that
loop (the caller waits for it). Once closed, ``get()`` raises ``PearlClientClosed``.
Redirects are not followed (``protocol.error_for``).
"""
from __future__ import annotations

import asyncio
import threading

import aiohttp

from pearl_rl_adapter.errors import PearlClientClosed


class LoopSession:
    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()
        self.closed = False

    def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.closed:
                raise PearlClientClosed(f"{self._owner} is closed")
            session = self._sessions.get(loop)
            if session is None or session.closed:
                for gone in [other for other in self._sessions if other.is_closed()]:
                    _let_go(gone, self._sessions.pop(gone))
                session = self._sessions[loop] = aiohttp.ClientSession()
            return session

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            self.closed = True
            sessions, self._sessions = self._sessions, {}
        for owner, session in sessions.items():
            if owner is loop:
                await session.close()
            elif owner.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(session.close(), owner))
            else:
                _let_go(owner, session)


def _let_go(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    """A session whose loop no longer runs: closed as far as it can be without it."""
    if session.closed:
        return
    connector = session.connector
    session.detach()
    if connector is not None and loop.is_closed():
        connector._close()  # only marks it closed: its loop cannot run anything now
