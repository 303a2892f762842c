"""``POST /generate``'s own HTTP/1.1 path, in front of aiohttp's server.

A rollout turn is one small POST whose answer is one JSON document (or a stream of SSE
events). Through aiohttp's server that cost ~150 us of CPU per request (a request
object, header multidicts, three middlewares, a response object): more than routing the
turn. Here the router reads each connection's bytes first. A whole, plain turn
(``POST``/``PUT /generate`` over HTTP/1.1 with a ``Content-Length`` JSON body within the
limit, and the API key when one is set) is answered here by the same functions as
aiohttp's handler (``parse_generate``, ``start_runs``, ``unstreamed_answer`` or
``stream_events``, the errors table, the same metrics). Anything else (another path, a
chunked or compressed body, ``Expect``, a wrong key, a body over the limit, a malformed
head) hands the connection, with every byte not yet answered, to aiohttp, which serves it
and the rest of that connection as before.

A client that hangs up while its turn runs cancels it at once (the dispatcher aborts it
at its worker). While the router stops, idle connections close, busy ones close after
their answer, and ``shutdown`` waits for the answers still being written.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable

from aiohttp.tcp_helpers import tcp_keepalive

from pearl_sglang import fastjson
from pearl_sglang.router.answers import Answer
from pearl_sglang.router.errors import RequestTimeout
from pearl_sglang.router.generate_request import parse_generate
from pearl_sglang.router.http1 import (LAST_CHUNK, MAX_HEAD, AnswerHeads, Head, bare_lf, chunk, parse_head,
                                       plain_json_length, wants_close)
from pearl_sglang.router.inference_routes import (StreamSlot, start_runs, stream_events, trajectory_headers,
                                                  unstreamed_answer)
from pearl_sglang.router.middleware import error_answer, generate_json, inference_allowed
from pearl_sglang.router.passthrough import SSE_CONTENT_TYPE

if TYPE_CHECKING:
    from pearl_sglang.router.state import RouterState

log = logging.getLogger("pearl.router")

CLOSE_S = 5.0  # how long a stop waits for answers still being written
KEEPALIVE_S = 3630.0  # an idle connection closes after this long, as aiohttp's do
_ROUTE = "/generate"  # the metrics' endpoint label, as aiohttp's route names it


class GenerateLane:
    """One router's lane: which requests it takes, and its connections (for stopping)."""

    def __init__(self, st: "RouterState") -> None:
        self.st = st
        self.doors: set[LaneDoor] = set()
        self.stopping = False
        self.answered = 0   # turns answered here (the rest went to aiohttp)
        self.handed_over = 0
        self._heads = AnswerHeads()
        self.keepalive_s = KEEPALIVE_S
        self._sweeper: asyncio.Task | None = None

    def takes(self, head: Head) -> int | None:
        """The body length of a plain turn, or None for aiohttp."""
        if head.method not in (b"POST", b"PUT") or head.target != b"/generate" or self.stopping:
            return None
        length = plain_json_length(head.headers, self.st.config.limits.max_body_bytes)
        security = self.st.config.security
        if length is None or (security.api_key is not None
                              and not inference_allowed(head.headers, security.admin_token, security.api_key)):
            return None
        return length

    def head_bytes(self, status: int, fields: bytes, close: bool) -> bytes:
        return self._heads(status, fields, close=close, now=self.st.clock.epoch())

    def door(self, transport: asyncio.Transport, client: str, *, hand_over: Callable[[bytes], None],
             started: Callable[[], None]) -> "LaneDoor":
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._close_idle())
        return LaneDoor(self, transport, client, hand_over=hand_over, started=started)

    async def _close_idle(self) -> None:
        """Close connections that carried no turn for ``keepalive_s`` (a peer that vanished
        without a FIN is also found by TCP keep-alive, on at every connection)."""
        while True:
            await self.st.clock.sleep(min(60.0, self.keepalive_s / 4))
            now = self.st.clock.now()
            for door in list(self.doors):
                if not door.busy and now - door.idle_since > self.keepalive_s:
                    door.stop()

    def stop_taking(self) -> None:
        """The router stops: idle connections close now, busy ones after their answer."""
        self.stopping = True
        for door in list(self.doors):
            door.stop()

    async def shutdown(self, timeout_s: float = CLOSE_S) -> None:
        """Stop taking turns, give those running ``timeout_s`` to write their answers (a
        stopping router has aborted them by now: each answers its output so far), then
        cancel the rest and close their connections."""
        self.stop_taking()
        if self._sweeper is not None:
            self._sweeper.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.doors and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for door in list(self.doors):
            door.lost()
            door.transport.close()


class LaneDoor:
    """One connection's reader: answers plain turns, or hands the connection to aiohttp
    (``hand_over(bytes)``: from then on every byte goes there)."""

    def __init__(self, lane: GenerateLane, transport: asyncio.Transport, client: str, *,
                 hand_over: Callable[[bytes], None], started: Callable[[], None]) -> None:
        self.lane = lane
        self.transport = transport
        self.client = client
        self._hand_over = hand_over
        self._started = started
        self._buf = bytearray()
        self._task: asyncio.Task | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._waiting: tuple[Head, int, int] | None = None  # a taken head: (head, body start, end)
        self._close_after = False
        self._status = 0  # the status of the answer under way, once its head is sent
        self._counted = False  # the answer under way is counted in the metrics
        self._writable: asyncio.Future | None = None  # while the client's buffer is full
        self._reading_paused = False
        self.idle_since = lane.st.clock.now()
        lane.doors.add(self)
        tcp_keepalive(transport)

    @property
    def busy(self) -> bool:
        """A turn is being answered (or a late body's 408)."""
        return self._task is not None

    def feed(self, data: bytes) -> None:
        self._buf += data
        if self._task is None:
            self._next()
        elif not self._reading_paused and len(self._buf) > self.lane.st.config.limits.max_body_bytes + MAX_HEAD:
            # A client sending ahead while its turn runs: read no more until it is answered.
            self._reading_paused = True
            self.transport.pause_reading()

    def stop(self) -> None:
        if self._task is None:
            self._close()
        else:
            self._close_after = True

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            if not self._writable.done():
                self._writable.set_result(None)
            self._writable = None

    def lost(self) -> None:
        """The client hung up: its running turn stops (the dispatcher aborts it at its worker)."""
        self._retire()
        if self._task is not None:
            self._task.cancel()

    # -- reading -------------------------------------------------------------------------
    def _next(self) -> None:
        buf = self._buf
        if self._waiting is None:  # a new request: its head first
            end = buf.find(b"\r\n\r\n")
            if bare_lf(buf if end < 0 else buf[:end]):
                self._give_up()
                return
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._give_up()
                return
            head = parse_head(bytes(buf[:end])) if end <= MAX_HEAD else None
            length = self.lane.takes(head) if head is not None else None
            if length is None:
                self._give_up()
                return
            self._started()
            self._waiting = (head, end + 4, end + 4 + length)
        head, body_at, total = self._waiting
        if len(buf) < total:
            if self._body_timer is None:
                timeout_s = self.lane.st.config.connections.body_timeout_s
                self._body_timer = asyncio.get_running_loop().call_later(timeout_s, self._body_late, timeout_s)
            return
        self._waiting = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        with memoryview(buf) as view:  # one copy of the body, not two (a slice, then bytes)
            body = bytes(view[body_at:total])
        del buf[:total]
        self._close_after = self._close_after or wants_close(head.headers)
        self._task = asyncio.ensure_future(self._serve(body, head))

    def _give_up(self) -> None:
        self._retire()
        self.lane.handed_over += 1
        data, self._buf = bytes(self._buf), bytearray()
        self._hand_over(data)

    def _body_late(self, timeout_s: float) -> None:
        self._body_timer = None
        self._close_after = True
        self._task = asyncio.ensure_future(self._answer_error(
            RequestTimeout(f"the body did not arrive within {timeout_s:.0f}s")))

    # -- answering -----------------------------------------------------------------------
    async def _serve(self, body: bytes, head: Head) -> None:
        st = self.lane.st
        started = st.clock.now()
        try:
            decoded, checked = generate_json(body, st.config.limits.max_json_depth)
            call = parse_generate(decoded, st.config.limits, checked)
            runs = start_runs(st, call, trajectory_headers(head.headers, batch=call.is_batch))
            try:
                if call.stream:
                    with StreamSlot(st, self.client):
                        await stream_events(self._open_stream, runs, call.is_batch)
                else:
                    answer = await unstreamed_answer(runs, call.is_batch)
                    self._write(200, b"Content-Type: application/json\r\n", fastjson.dumps(answer))
            finally:
                st.metrics.latency.labels("generate").observe(st.clock.now() - started)
        except asyncio.CancelledError:  # the client hung up
            if self._status:
                log.info("client %s left a /generate stream", self.client)
            if not self._counted:
                self.count(self._status or 499)
            raise
        except Exception as e:  # noqa: BLE001 - each is answered, as errors_middleware does
            if self._status:  # a stream's head is out: no other answer can follow on this connection
                log.error("POST /generate stream failed after its head was sent", exc_info=e)
                self._close()
                return
            await self._answer_error(e)
            return
        self._finish()

    async def _answer_error(self, error: Exception) -> None:
        try:
            self._write_answer(error_answer(error, "POST /generate"))
        except Exception:  # noqa: BLE001 - never leave the connection waiting for an answer
            log.exception("POST /generate: the error answer could not be written; closing the connection")
            self._close()
            return
        self._finish()

    def count(self, status: int) -> None:
        """The answer under way, in the request metrics (once)."""
        self._counted = True
        self.lane.st.metrics.requests.labels(_ROUTE, str(status)).inc()

    def _write_answer(self, answer: Answer) -> None:
        # The content type aiohttp's json_response (the router's own answers) or Response sends.
        content_type = ("application/json; charset=utf-8" if answer.document is not None
                        else answer.content_type.split(";")[0])
        self._write(answer.status, b"Content-Type: %s\r\n" % content_type.encode(), answer.body())

    def _write(self, status: int, fields: bytes, body: bytes) -> None:
        self.send_head(status, fields + b"Content-Length: %d\r\n" % len(body), body)
        self.count(status)

    def send_head(self, status: int, fields: bytes, then: bytes = b"") -> None:
        self._close_after = self._close_after or self.lane.stopping
        self._status = status
        if not self.transport.is_closing():
            self.transport.write(self.lane.head_bytes(status, fields, self._close_after) + then)

    async def _open_stream(self) -> "_EventStream":
        return _EventStream(self)

    async def drained(self) -> None:
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def _finish(self) -> None:
        self._task = None
        self._status = 0
        self._counted = False
        self.idle_since = self.lane.st.clock.now()
        self.lane.answered += 1
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._close_after or self.lane.stopping:
            self._close()
        elif self._buf:
            self._next()

    def _close(self) -> None:
        self._retire()
        self.transport.close()

    def _retire(self) -> None:
        """Handed over or closed: the lane forgets the connection."""
        self.lane.doors.discard(self)
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None


class _EventStream:
    """A 200 ``text/event-stream`` answer, chunked; its head goes out with the first events."""

    FIELDS = b"Content-Type: %s\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n" % (
        SSE_CONTENT_TYPE.encode())

    def __init__(self, door: LaneDoor) -> None:
        self.door = door
        self._head_sent = False

    async def write(self, data: bytes) -> None:
        self._send(chunk(data))
        await self.door.drained()

    async def write_eof(self, data: bytes = b"") -> None:
        self._send((chunk(data) if data else b"") + LAST_CHUNK)
        self.door.count(200)

    def _send(self, data: bytes) -> None:
        if not self._head_sent:
            self._head_sent = True
            self.door.send_head(200, self.FIELDS, data)
        elif not self.door.transport.is_closing():
            self.door.transport.write(data)
