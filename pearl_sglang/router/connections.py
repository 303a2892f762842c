"""Client connections the router accepts, bounded so that slow or idle peers cannot take
service away from everyone else.

* A connection must finish a request's headers within ``header_timeout_s`` of opening
  (slowloris peers and half-open connections are closed); bodies are read under
  ``body_timeout_s`` (``read_json``).
* One client address holds at most ``max_per_client`` connections.
* All clients together hold at most ``max_total``, derived from the descriptor limit with
  room kept for the router's own connections to workers, so the process never reaches
  EMFILE (where asyncio stops accepting and logs a traceback per attempt).

Past a cap the connection is answered a 503 and closed at once: the peer learns why, and
its descriptor is free again. An admitted connection is read by the ``/generate`` lane
first (``generate_lane``), which hands it to aiohttp's per-connection protocol for
anything but a plain rollout turn; aiohttp itself is unchanged.

A malformed HTTP message (a bad header byte, a non-numeric Content-Length) is answered 400
by aiohttp, which also logs a traceback at ERROR for it; a peer could fill the log that
way, so the router logs one INFO line instead (``MalformedHttpFilter``).
"""
from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_runner import BaseSite

log = logging.getLogger("pearl.router.connections")

# Descriptors kept for everything that is not a client connection (workers, logs, files).
RESERVED_FDS = 64


class CannotListen(OSError):
    """The router's address cannot be bound."""


class MalformedHttpFilter(logging.Filter):
    """A client's malformed HTTP message: one INFO line, not an ERROR with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BadHttpMessage):
            reason = exc.message.strip().splitlines()[0].rstrip(":") if exc.message else type(exc).__name__
            record.msg, record.args = "%s: 400 %s", (record.getMessage(), reason)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


MALFORMED_HTTP = MalformedHttpFilter()


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (as SGLang does); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def default_max_total() -> int:
    """Half of what the descriptor limit leaves: each client request may hold one
    connection to a worker as well."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, (soft - RESERVED_FDS) // 2)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # As many as the default streams per client: one trainer host may run thousands of
    # rollouts at once; the cap is there to stop one address from taking all descriptors.
    max_per_client: int = 4096
    max_total: int | None = None  # None: derived from the descriptor limit at start
    # On SIGTERM: how long requests in flight may take before they are aborted with their
    # output so far (server.stopping).
    shutdown_grace_s: float = 30.0

    def validate(self) -> None:
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0) or self.max_per_client < 1:
            raise ValueError("connection timeouts must be > 0 and max_per_client >= 1")
        if self.max_total is not None and self.max_total < 1:
            raise ValueError("max_total must be >= 1")
        if self.shutdown_grace_s < 0:
            raise ValueError("shutdown_grace_s must be >= 0")


def _refusal(message: str) -> bytes:
    body = ('{"error": {"message": "%s", "type": "limit_connections", "code": 503}}' % message).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Retry-After: 1\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class Lane(Protocol):
    """The ``/generate`` lane (``generate_lane.GenerateLane``) in front of aiohttp."""

    stopping: bool

    def door(self, transport: asyncio.Transport, client: str, *, hand_over: Callable[[bytes], None],
             started: Callable[[], None]) -> Any: ...

    def stop_taking(self) -> None: ...


class ConnectionGuard:
    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.max_total = limits.max_total or default_max_total()
        self.per_client: dict[str, int] = {}
        self.total = 0
        self.refused = 0
        self.timed_out = 0
        self.lane: Lane | None = None  # reads each connection first (set by build_router)
        self._open: dict[int, "_Guarded"] = {}  # by id() of aiohttp's protocol

    def request_started(self, protocol: object) -> None:
        """A request's headers arrived on this connection (called by a middleware)."""
        guarded = self._open.get(id(protocol))
        if guarded is not None:
            guarded.started = True

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, inner)


class _Guarded(asyncio.Protocol):
    """Admits the connection, then lets the lane read it; aiohttp's protocol (made by
    ``make_inner``) takes over when the lane hands the connection on, or at once without
    a lane."""

    def __init__(self, guard: ConnectionGuard, make_inner: Callable[[], asyncio.Protocol]) -> None:
        self.guard, self.make_inner = guard, make_inner
        self.inner: Any = None
        self.door: Any = None
        self.transport: asyncio.Transport | None = None
        self.client: str | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        g = self.guard
        peer = transport.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) else str(peer)
        reason = None
        if g.total >= g.max_total:
            reason = f"the router holds {g.total} connections (max {g.max_total})"
        elif g.per_client.get(client, 0) >= g.limits.max_per_client:
            reason = f"client {client} holds {g.limits.max_per_client} connections (max_per_client)"
        if reason is not None:
            g.refused += 1
            if g.refused == 1 or g.refused % 1000 == 0:
                log.warning("refusing connections: %s (%d refused so far)", reason, g.refused)
            transport.write(_refusal(reason))
            transport.close()
            return
        self.client = client
        self.transport = transport  # type: ignore[assignment]
        g.total += 1
        g.per_client[client] = g.per_client.get(client, 0) + 1
        self.deadline = asyncio.get_running_loop().call_later(g.limits.header_timeout_s, self._header_deadline,
                                                               transport)
        if g.lane is not None and not g.lane.stopping:
            self.door = g.lane.door(self.transport, client, hand_over=self._hand_over, started=self._started)
        else:
            self._open_inner()

    def _open_inner(self) -> None:
        self.inner = self.make_inner()
        self.guard._open[id(self.inner)] = self  # noqa: SLF001 - the guard's own table
        self.inner.connection_made(self.transport)

    def _hand_over(self, data: bytes) -> None:
        self.door = None
        self._open_inner()
        if data:
            self.inner.data_received(data)

    def _started(self) -> None:
        self.started = True

    def _header_deadline(self, transport: asyncio.BaseTransport) -> None:
        if not self.started:
            self.guard.timed_out += 1
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.door is not None:
            self.door.feed(data)
        elif self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.door is not None:
            self.door.pause_writing()
        elif self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.door is not None:
            self.door.resume_writing()
        elif self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused
            return
        g = self.guard
        if self.deadline is not None:
            self.deadline.cancel()
        g.total -= 1
        g.per_client[self.client] -= 1
        if not g.per_client[self.client]:
            del g.per_client[self.client]
        if self.door is not None:
            self.door.lost()
        if self.inner is not None:
            g._open.pop(id(self.inner), None)  # noqa: SLF001
            self.inner.connection_lost(exc)


class GuardedTCPSite(web.TCPSite):
    """``web.TCPSite`` whose connections pass through a ``ConnectionGuard``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard, **kw: Any) -> None:
        super().__init__(runner, host, port, **kw)
        self.guard = guard

    async def start(self) -> None:
        await BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.guard.factory(self._runner.server), self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


async def start_site(app: web.Application, guard: ConnectionGuard, host: str, port: int,
                     backlog: int = 4096, close_s: float = 60.0) -> tuple[web.AppRunner, int]:
    """Serve ``app`` through ``guard``; returns the runner (to clean up) and the bound port.
    ``close_s``: how long the runner's clean-up waits for handlers still running."""
    logging.getLogger("aiohttp.server").addFilter(MALFORMED_HTTP)  # once: the same object
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=close_s)
    await runner.setup()
    site = GuardedTCPSite(runner, host, port, guard, backlog=backlog)
    try:
        await site.start()
    except (OSError, UnicodeError) as e:  # in use, not an address of this host, unresolvable
        await runner.cleanup()
        raise CannotListen(f"cannot listen on {host}:{port}: {e}") from e
    return runner, site._bound_port  # noqa: SLF001 - set by start() above
