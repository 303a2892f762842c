"""Keep-alive HTTP/1.1 connections from the router to its workers, for ``/generate``.

Every rollout turn is one POST to a known worker whose answer the router reads as it
comes. aiohttp's client spent more CPU on that than everything else the router does for
a request (a request and a response object, header multidicts, timers, trace hooks per
call). Here it is an asyncio protocol: one write per request (head and body), the
status line and headers parsed once, the body (``Content-Length``, chunked, or up to
close) handed over in pieces as it arrives, and each connection kept per worker for the
next request once its answer was read to the end.

A worker may close a connection that waited in the pool (uvicorn closes idle ones after
5 s): a pooled connection whose close already arrived is dropped, and a request whose
reused connection broke before any byte of the answer came is sent once more on a new one
(the worker never read it). ``IDLE_S`` only bounds how long a connection nobody closed is
trusted (a peer that vanished without a FIN). Idle time is the loop's: in a virtual-time
replay a new connection's handshake can let the clock jump, so connections are kept
rather than reopened between turns. Silence longer than ``read_s`` while waiting for the answer is a
``ReadTimeout``, however long the whole answer takes.
"""
from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

IDLE_S = 300.0
MAX_IDLE_PER_WORKER = 512
_PAUSE_BYTES = 1 << 24  # unread body held before the worker is asked to wait


class ConnectFailed(OSError):
    """The worker could not be reached."""


class ConnectionBroken(ConnectionError):
    """The connection closed before the answer was whole."""


class ReadTimeout(TimeoutError):
    """The worker stayed silent for longer than the read bound."""


def _head(method: bytes, path: str, host: bytes, length: int) -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
        method, path.encode(), host, length)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int]) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self._buf = bytearray()
        self._head_done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self._mode = ""           # "length", "chunked" or "close"
        self._left = 0            # bytes left: of the body ("length") or of the current chunk
        self._chunk_state = 0     # chunked: 0 size line, 1 data, 2 CRLF after data, 3 trailers
        self._pieces: deque[bytes] = deque()
        self._held = 0
        self.complete = False
        self.got_bytes = False
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._read_s = 0.0
        self._active_at = 0.0
        self._paused = False
        self._timed_out = False

    # -- protocol callbacks ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._mode == "close" and self._head_done and not self.complete:
            self.complete = True
        self.lost = exc or ConnectionBroken("the worker closed the connection")
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._active_at = self.loop.time()
        self._buf += data
        try:
            self._parse()
        except ValueError as e:
            self.lost = ConnectionBroken(f"malformed answer from the worker: {e}")
            self.keep_alive = False
            self.transport.close()
        if self._held > _PAUSE_BYTES and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- parsing ------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._buf
        if not self._head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[:end + 4]
            version, status = lines[0].split(" ", 2)[:2]
            self.status = int(status)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self.headers = headers
            self._head_done = True
            self.keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._mode = "chunked"
            elif "content-length" in headers:
                self._mode, self._left = "length", int(headers["content-length"])
                self.complete = self._left == 0
            else:
                self._mode, self.keep_alive = "close", False
        if self._mode == "length":
            if buf and not self.complete:
                take = bytes(buf[:self._left])
                del buf[:len(take)]
                self._push(take)
                self._left -= len(take)
                self.complete = self._left == 0
        elif self._mode == "chunked":
            self._parse_chunks(buf)
        elif buf:
            self._push(bytes(buf))
            buf.clear()

    def _parse_chunks(self, buf: bytearray) -> None:
        while buf and not self.complete:
            state = self._chunk_state
            if state == 0:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
                del buf[:end + 2]
                self._left = size
                self._chunk_state = 1 if size else 3
            elif state == 1:
                take = bytes(buf[:self._left])
                del buf[:len(take)]
                self._push(take)
                self._left -= len(take)
                if not self._left:
                    self._chunk_state = 2
            elif state == 2:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ValueError("a chunk does not end with CRLF")
                del buf[:2]
                self._chunk_state = 0
            else:  # trailers: lines up to an empty one
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[:end + 2]
                if end == 0:
                    self.complete = True

    def _push(self, piece: bytes) -> None:
        if piece:
            self._pieces.append(piece)
            self._held += len(piece)

    # -- the caller's side --------------------------------------------------------------
    def send(self, data_head: bytes, body: bytes, read_s: float) -> None:
        self._reset()
        self._read_s = read_s
        self._active_at = self.loop.time()
        self._timer = self.loop.call_at(self._active_at + read_s, self._check_silence)
        self.transport.writelines((data_head, body))

    def _check_silence(self) -> None:
        quiet_until = self._active_at + self._read_s
        if self.loop.time() >= quiet_until:
            self._timer = None
            self._timed_out = True
            w = self._waiter
            if w is not None and not w.done():
                w.set_result(None)
        else:
            self._timer = self.loop.call_at(quiet_until, self._check_silence)

    async def _wait(self) -> None:
        """Until something arrives (or the connection is lost, or the read bound passes)."""
        if self.lost is None and not self._timed_out:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._timed_out:
            raise ReadTimeout(f"no data for {self._read_s:.0f}s")
        if self.lost is not None and not (self._pieces or self.complete):
            raise ConnectionBroken(f"connection lost: {self.lost!r}")

    async def read_head(self) -> None:
        while not self._head_done:
            await self._wait()

    async def read_piece(self) -> bytes | None:
        """The next piece of the body, or None once the body is whole."""
        while True:
            if self._pieces:
                piece = self._pieces.popleft()
                self._held -= len(piece)
                if self._paused and self._held < _PAUSE_BYTES // 2:
                    self._paused = False
                    self.transport.resume_reading()
                return piece
            if self.complete:
                return None
            await self._wait()

    async def read_all(self) -> bytes:
        parts = []
        while (piece := await self.read_piece()) is not None:
            parts.append(piece)
        return b"".join(parts)

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def reusable(self) -> bool:
        return (self.complete and self.keep_alive and self.lost is None and not self._buf
                and self.transport is not None and not self.transport.is_closing())


class WorkerConnections:
    """Connections per worker (host, port): idle ones are reused, newest first."""

    def __init__(self, *, connect_s: float) -> None:
        self.connect_s = connect_s
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._hosts: dict[str, tuple[tuple[str, int], bytes]] = {}
        self.opened = 0

    def _target(self, url: str) -> tuple[tuple[str, int], bytes]:
        target = self._hosts.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ConnectFailed(f"only http:// workers are supported, got {url!r}")
            port = parts.port or 80
            target = self._hosts[url] = ((parts.hostname, port), parts.netloc.encode())
        return target

    async def _open(self, key: tuple[str, int]) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(lambda: Connection(loop, key), key[0], key[1])
        except (OSError, TimeoutError) as e:
            raise ConnectFailed(f"cannot connect to {key[0]}:{key[1]}: {e!r}") from e
        self.opened += 1
        return conn

    def _pooled(self, key: tuple[str, int]) -> Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_ok = asyncio.get_running_loop().time() - IDLE_S
        while idle:
            conn = idle.pop()
            if conn.idle_since >= oldest_ok and conn.lost is None and not conn.transport.is_closing():
                return conn
            conn.transport.close()
        return None

    async def post(self, url: str, path: str, body: bytes, *, read_s: float) -> Connection:
        """Send the request and return its connection once the answer's head is read;
        the caller reads the body and then hands the connection to ``release``."""
        key, host = self._target(url)
        head = _head(b"POST", path, host, len(body))
        conn = self._pooled(key)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._open(key)
            conn.send(head, body, read_s)
            try:
                await conn.read_head()
                return conn
            except ConnectionBroken:
                conn.finish()
                conn.transport.close()
                if not reused or conn.got_bytes:
                    raise
                conn, reused = None, False  # the worker closed it while it waited: once more, new
            except BaseException:
                self.release(conn)
                raise

    def release(self, conn: Connection) -> None:
        conn.finish()
        if conn.reusable:
            conn.idle_since = asyncio.get_running_loop().time()
            idle = self._idle.setdefault(conn.key, [])
            if len(idle) < MAX_IDLE_PER_WORKER:
                idle.append(conn)
                return
        conn.transport.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
