"""HTTP calls from the router to one SGLang worker, with typed failures.

Every ``/generate`` goes to workers as a stream, even when the client asked for one JSON
reply: the router then holds every token the worker reported, so a worker that dies
without answering (SGLang's scheduler can crash) loses nothing already generated.

The dispatcher reaches workers through a ``WorkerTransport``: ``HttpTransport`` for real
servers; the benchmark harness plugs in emulated workers that run in its own process
(``benchmarks.harness.in_process_transport``).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

import aiohttp

from pearl_sglang import fastjson
from pearl_sglang.router.errors import WorkerFailed, WorkerRejected, WorkerStalled, WorkerUnavailable
from pearl_sglang.router.worker_http import ConnectFailed, ReadTimeout, WorkerConnections

# A cumulative chunk of a long output (prompt ids included) can be megabytes long.
_READ_BUFSIZE = 1 << 24


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    # The stall bound: the longest a worker may stay silent on a stream (router/stall.py).
    chunk_s: float = 600.0
    control_s: float = 30.0


def _id(slot: int | str) -> str:
    return str(slot)


def status_error(worker: str, status: int, data: bytes, content_type: str = "application/json") -> Exception:
    """A worker's error answer as a typed failure: the client's own fault (4xx, except a
    timeout or throttling, which are retried elsewhere) is passed on, the rest is the worker's."""
    if 400 <= status < 500 and status not in (408, 429):
        return WorkerRejected(worker, status, data, content_type)
    return WorkerFailed(worker, f"HTTP {status}: {data[:200]!r}")


async def _raise_for_status(resp: aiohttp.ClientResponse, worker: str) -> None:
    if resp.status < 400:
        return
    raise status_error(worker, resp.status, await resp.read(), resp.headers.get("Content-Type", "application/json"))


def _error_event(worker: str, event: dict[str, Any]) -> Exception:
    err = event.get("error")
    info = err if isinstance(err, dict) else {"message": str(err)}
    code = info.get("code") if isinstance(info.get("code"), int) else 500
    if 400 <= code < 500:
        body = json.dumps({"error": info}).encode()
        return WorkerRejected(worker, code, body, "application/json")
    return WorkerFailed(worker, f"error event: {info.get('message')}")


async def stream_generate(connections: WorkerConnections, *, slot: int, url: str,
                          body: dict[str, Any], timeouts: Timeouts) -> AsyncIterator[dict[str, Any]]:
    """Yield the worker's cumulative chunks; the last one carries ``finish_reason``."""
    worker = _id(slot)
    done = False
    conn = None
    try:
        conn = await connections.post(url, "/generate", fastjson.dumps({**body, "stream": True}),
                                      read_s=timeouts.chunk_s)
        if conn.status >= 400:
            raise status_error(worker, conn.status, await conn.read_all(),
                               conn.headers.get("content-type", "application/json"))
        rest = b""
        while True:
            piece = await conn.read_piece()
            ended = piece is None
            if done or (ended and not rest):
                if ended:
                    break
                continue  # read to the end: a finished answer hands its connection back
            if ended:
                piece = b"\n"  # the body's last line came without its newline
            lines = (rest + piece).split(b"\n") if rest else piece.split(b"\n")
            rest = lines.pop()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                event = fastjson.loads(payload)
                if "error" in event:
                    raise _error_event(worker, event)
                yield event
            if ended:
                break
    except ReadTimeout as e:
        if not done:
            raise WorkerStalled(worker, f"no chunk for {timeouts.chunk_s:.0f}s (stall bound)") from e
    except (ConnectFailed, ConnectionError, ValueError) as e:
        if not done:
            raise WorkerUnavailable(worker, f"stream broke: {e!r}") from e
    finally:
        if conn is not None:
            connections.release(conn)
    if not done:
        raise WorkerUnavailable(worker, "stream ended without [DONE]")


async def post_json(session: aiohttp.ClientSession, *, slot: int, url: str, path: str,
                    body: Any, timeouts: Timeouts) -> Any:
    """A control or prefill call that answers with one JSON document (or none)."""
    worker = _id(slot)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.chunk_s)
    try:
        async with session.post(url + path, data=fastjson.dumps(body), headers=fastjson.JSON_HEADERS,
                                timeout=timeout, read_bufsize=_READ_BUFSIZE) as resp:
            await _raise_for_status(resp, worker)
            data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
        raise WorkerUnavailable(worker, f"{path} failed: {e!r}") from e
    if not data.strip():
        return None
    try:
        return fastjson.loads(data)
    except ValueError:
        return data.decode(errors="replace")


async def abort(session: aiohttp.ClientSession, *, url: str, rid: str, timeouts: Timeouts) -> bool:
    """Best effort: a worker that cannot be reached holds nothing we can save anyway."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeouts.control_s, sock_connect=timeouts.connect_s)
        async with session.post(url + "/abort_request", json={"rid": rid}, timeout=timeout) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
        return False


class WorkerTransport(Protocol):
    """The calls the dispatcher makes to a worker, with the failures above. A body's
    ``input_ids`` may be ``EncodedIds`` (ids kept as their JSON text): ``fastjson``
    writes them as that text; a transport that needs a list calls ``decoded()``."""

    def stream_generate(self, *, slot: int, url: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...

    async def post_json(self, *, slot: int, url: str, path: str, body: Any) -> Any: ...

    async def abort(self, *, url: str, rid: str) -> bool: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class HttpTransport:
    """Streams over the router's own keep-alive connections (``worker_http``); the
    occasional control or prefill call over the application's aiohttp session."""

    session: aiohttp.ClientSession
    timeouts: Timeouts
    connections: WorkerConnections | None = None

    def __post_init__(self) -> None:
        if self.connections is None:
            object.__setattr__(self, "connections", WorkerConnections(connect_s=self.timeouts.connect_s))

    def stream_generate(self, *, slot: int, url: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return stream_generate(self.connections, slot=slot, url=url, body=body, timeouts=self.timeouts)

    async def post_json(self, *, slot: int, url: str, path: str, body: Any) -> Any:
        return await post_json(self.session, slot=slot, url=url, path=path, body=body, timeouts=self.timeouts)

    async def abort(self, *, url: str, rid: str) -> bool:
        return await abort(self.session, url=url, rid=rid, timeouts=self.timeouts)

    async def close(self) -> None:
        self.connections.close()


TransportFactory = Callable[[aiohttp.ClientSession, Timeouts], WorkerTransport]
