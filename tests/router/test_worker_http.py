"""The router's own HTTP/1.1 client to its workers: answers split anywhere on the wire,
every body framing, connections a worker closed while they waited in the pool."""
from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiohttp import web

from pearl_sglang.workers.client import Timeouts, stream_generate
from pearl_sglang.workers.connections import WorkerConnections
from pearl_sglang.workers.errors import WorkerRejected, WorkerStalled, WorkerUnavailable

EVENTS = b'data: {"output_ids": [7], "meta_info": {}}\n\ndata: {"output_ids": [7, 8], "meta_info": {}}\n\ndata: [DONE]\n\n'


@contextlib.asynccontextmanager
async def raw_worker(answer: bytes, *, piece: int = 1, close: bool = False):
    """A worker that writes ``answer`` ``piece`` bytes at a time, whatever it was sent."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                for i in range(0, len(answer), piece):
                    writer.write(answer[i:i + piece])
                    await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def _chunked(body: bytes, size: int, trailer: bytes = b"") -> bytes:
    parts = [b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n" + trailer + b"\r\n"


async def _outputs(connections: WorkerConnections, url: str, **kw) -> list:
    return [c["output_ids"] async for c in stream_generate(connections, slot=0, url=url, body={"input_ids": [1]},
                                                           timeouts=Timeouts(**kw))]


@pytest.mark.parametrize("framing", ["chunked", "trailers", "length", "close", "no-final-newline"])
async def test_answers_split_anywhere_read_alike(framing):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    answer = {
        "chunked": head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(EVENTS, 11),
        "trailers": head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(EVENTS, 40, b"X-T: 1\r\n"),
        "length": head + b"Content-Length: %d\r\n\r\n" % len(EVENTS) + EVENTS,
        "close": head + b"Connection: close\r\n\r\n" + EVENTS,
        "no-final-newline": head + b"Content-Length: %d\r\n\r\n" % (len(EVENTS) - 2) + EVENTS[:-2],
    }[framing]
    connections = WorkerConnections(connect_s=5)
    async with raw_worker(answer, piece=3, close=framing == "close") as url:
        for _ in range(3):
            assert await _outputs(connections, url) == [[7], [7, 8]]
    reused = framing != "close"
    assert connections.opened == (1 if reused else 3)
    connections.close()


async def test_an_error_answer_is_the_workers_rejection():
    body = b'{"error": {"message": "bad"}}'
    answer = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)
    connections = WorkerConnections(connect_s=5)
    async with raw_worker(answer, piece=5) as url:
        with pytest.raises(WorkerRejected) as e:
            await _outputs(connections, url)
    assert e.value.status == 400 and e.value.body == body
    connections.close()


async def test_silence_is_a_stall_and_a_cut_stream_is_unavailable():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    connections = WorkerConnections(connect_s=5)
    async with raw_worker(head + _chunked(EVENTS, 30)[:40]) as url:  # then nothing
        with pytest.raises(WorkerStalled):
            await _outputs(connections, url, chunk_s=0.3)
    async with raw_worker(head + _chunked(EVENTS, 30)[:40], close=True) as url:
        with pytest.raises(WorkerUnavailable):
            await _outputs(connections, url)
    with pytest.raises(WorkerUnavailable):
        await _outputs(connections, "http://127.0.0.1:9")
    connections.close()


async def test_a_connection_the_worker_closed_while_pooled_is_replaced():
    """aiohttp's server closes idle keep-alive connections after ``keepalive_timeout``
    (uvicorn after 5 s): the next request must not fail for it."""
    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(EVENTS)
        return resp

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, keepalive_timeout=0.05)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    connections = WorkerConnections(connect_s=5)
    try:
        for _ in range(4):
            assert await _outputs(connections, url) == [[7], [7, 8]]
            await asyncio.sleep(0.2)
    finally:
        connections.close()
        await runner.cleanup()
    assert connections.opened == 4
