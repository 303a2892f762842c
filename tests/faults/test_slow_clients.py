"""Slow senders and idle peers are bounded: idle and half-sent requests are cut by header
and body timeouts, and connection caps answer a 503 instead of letting one address (or
all of them) exhaust the descriptors."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import httpx
import pytest

from pearl_sglang.router.connections import ConnectionLimits
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import running_router, with_limits


def _config(**conn):
    return replace(with_limits(), connections=ConnectionLimits(**conn))


async def _open(port: int, host: str = "127.0.0.1", local: str | None = None):
    return await asyncio.open_connection(host, port, local_addr=(local, 0) if local else None)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_a_connection_that_sends_no_headers_is_closed():
    async with running_router(regular=["http://127.0.0.1:9"], config=_config(header_timeout_s=0.5)) as (url, app, _):
        reader, writer = await _open(_port(url))
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\n")  # never finishes the headers
        await writer.drain()
        started = time.monotonic()
        data = await asyncio.wait_for(reader.read(), 10)
        elapsed = time.monotonic() - started
        writer.close()
        timed_out = app[ROUTER].connections.timed_out
    assert data == b"" and elapsed < 5 and timed_out == 1


async def test_a_body_that_does_not_arrive_is_a_408():
    async with running_router(regular=["http://127.0.0.1:9"], config=_config(body_timeout_s=0.5)) as (url, _, _):
        reader, writer = await _open(_port(url))
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\":")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(4096), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head[:200]
    assert b"body_timeout" in head


async def test_connection_caps_answer_503_and_spare_other_clients():
    async with running_router(regular=["http://127.0.0.1:9"],
                              config=_config(max_per_client=3, max_total=5)) as (url, app, _):
        held = [await _open(_port(url)) for _ in range(3)]
        await asyncio.sleep(0.1)
        reader, writer = await _open(_port(url))
        refused = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        # Another address is not held back by the first one's cap...
        async with httpx.AsyncClient(timeout=10, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")) as c:
            other = await c.get(url + "/health")
        # ...until all clients together reach the total cap.
        more = [await _open(_port(url), local="127.0.0.3") for _ in range(2)]
        await asyncio.sleep(0.1)
        reader, writer = await _open(_port(url), local="127.0.0.4")
        full = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        for _, w in held + more:
            w.close()
        refused_count = app[ROUTER].connections.refused
    assert refused.startswith(b"HTTP/1.1 503") and b"max_per_client" in refused, refused[:300]
    assert other.status_code == 200
    assert full.startswith(b"HTTP/1.1 503") and b"limit_connections" in full, full[:300]
    assert refused_count == 2

