"""A TCP proxy that injects network faults between the router and one worker.

Tests attach the router to the proxy's URL instead of the worker's and switch the
proxy's behaviour while requests are in flight: pass bytes through, delay each chunk,
hang (keep every connection open and forward nothing), reset every connection with a TCP
RST, or cut each connection after a number of bytes sent back to the client. Switching
applies at once to live connections as well as new ones, so a fault can hit a request
mid-stream. Loopback only; no HTTP knowledge.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from enum import Enum


class Fault(str, Enum):
    PASS = "pass"
    DELAY = "delay"
    HANG = "hang"
    RESET = "reset"
    CUT = "cut"


_CHUNK = 1 << 16


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    sent: int = 0  # bytes forwarded to the client since the fault was last set

    def reset(self) -> None:
        """Close both sides with RST (SO_LINGER 0), never a graceful FIN."""
        for writer in (self.client, self.upstream):
            if writer is None or writer.transport.is_closing():
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


@dataclass
class FaultProxy:
    """``async with FaultProxy(target_port) as proxy``; then ``proxy.url`` and ``proxy.set``."""

    target_port: int
    target_host: str = "127.0.0.1"
    fault: Fault = Fault.PASS
    delay_s: float = 0.0
    cut_after: int = 0
    accepted: int = 0
    _conns: set[_Conn] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.AbstractServer | None = None
    _port: int = 0

    @classmethod
    def to(cls, url: str) -> "FaultProxy":
        host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        return cls(target_port=int(port), target_host=host)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def live(self) -> int:
        return len(self._conns)

    def set(self, fault: Fault, *, delay_s: float = 0.0, cut_after: int = 0) -> None:
        """Switch behaviour now, for live connections too."""
        self.fault, self.delay_s, self.cut_after = fault, delay_s, cut_after
        for conn in list(self._conns):
            conn.sent = 0
            if fault is Fault.RESET:
                conn.reset()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def __aenter__(self) -> "FaultProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.reset()
        self.set(Fault.PASS)  # wake hung pumps so they see their closed sockets
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = _Conn(client=writer)
        self._conns.add(conn)
        try:
            if self.fault is Fault.RESET:
                return conn.reset()
            try:
                up_reader, conn.upstream = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                return conn.reset()
            await asyncio.gather(self._pump(conn, reader, conn.upstream, to_client=False),
                                 self._pump(conn, up_reader, writer, to_client=True))
        finally:
            self._conns.discard(conn)
            conn.reset()

    async def _gate(self) -> Fault:
        """The fault to apply to the next chunk; while hanging, wait for a change."""
        while self.fault is Fault.HANG:
            await self._changed.wait()
        return self.fault

    async def _pump(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    *, to_client: bool) -> None:
        try:
            while data := await reader.read(_CHUNK):
                fault = await self._gate()
                if fault is Fault.RESET:
                    return conn.reset()
                if fault is Fault.DELAY:
                    await asyncio.sleep(self.delay_s)
                if fault is Fault.CUT and to_client:
                    room = self.cut_after - conn.sent
                    if len(data) >= room:
                        writer.write(data[:max(room, 0)])
                        with contextlib.suppress(ConnectionError):
                            await writer.drain()
                        return conn.reset()
                writer.write(data)
                await writer.drain()
                if to_client:
                    conn.sent += len(data)
            if await self._gate() is Fault.RESET:
                return conn.reset()
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()  # a half-close is forwarded too, unless hanging
        except (ConnectionError, OSError):
            conn.reset()
