"""The floor of any userspace router's added latency: a TCP relay in Python (uvloop).

    python -m benchmarks.harness.relay --port P --upstream http://127.0.0.1:W1 [...]

Each client connection gets one upstream connection (the upstreams taken in turn) and
every byte is copied both ways unread: no parsing, no routing, no HTTP. What a router adds
over this is its own work; what this adds over a direct connection is the extra hop
(two more socket passes and the wake-ups of one more process). ``router_overhead.py``
runs it as the target ``relay`` beside the routers.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
from urllib.parse import urlparse

from pearl_sglang.workers.addresses import check_worker_url

_HIGH = 1 << 20  # pause the reading side once the other side buffers this much


class _Half(asyncio.Protocol):
    """One side of a relayed connection; ``peer`` is the other side once it is up."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=_HIGH)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            return
        peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def flush_to(self, other: "_Half") -> None:
        for data in self.pending:
            other.transport.write(data)
        self.pending.clear()


async def serve(host: str, port: int, upstreams: list[tuple[str, int]]) -> None:
    loop = asyncio.get_running_loop()
    turn = itertools.cycle(upstreams)

    def accept() -> _Half:
        client = _Half()
        up_host, up_port = next(turn)

        async def connect() -> None:
            try:
                _, upstream = await loop.create_connection(_Half, up_host, up_port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            upstream.peer, client.peer = client, upstream
            client.flush_to(upstream)
            if client.transport is None or client.transport.is_closing():
                upstream.transport.close()

        loop.create_task(connect())
        return client

    server = await loop.create_server(accept, host, port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", nargs="+", required=True, help="worker URLs, taken in turn per connection")
    args = ap.parse_args(argv)
    upstreams = []
    for url in args.upstream:
        try:
            check_worker_url(url)
        except ValueError as e:
            ap.error(str(e))
        parts = urlparse(url)
        upstreams.append((parts.hostname, parts.port or 80))
    try:
        import uvloop
        uvloop.run(serve(args.host, args.port, upstreams))
    except ImportError:
        asyncio.run(serve(args.host, args.port, upstreams))


if __name__ == "__main__":
    main()
