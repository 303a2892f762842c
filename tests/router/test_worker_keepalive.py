"""The router's streams from a worker hand their connection back when they end, so a
busy router does not open (and a worker accept) a TCP connection per request."""
from __future__ import annotations

import asyncio

from aiohttp import web

from pearl_sglang.workers.client import Timeouts, stream_generate
from pearl_sglang.workers.connections import WorkerConnections


async def _sse_worker() -> tuple[web.AppRunner, str, set]:
    peers: set = set()

    async def generate(request: web.Request) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername"))
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for n in (1, 2):
            await resp.write(b'data: {"output_ids": %s, "meta_info": {}}\n\n' % str(list(range(n))).encode())
        await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(0.05)  # the end of the body comes a moment after [DONE], as in SGLang
        return resp

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", peers


async def test_finished_streams_reuse_one_connection():
    runner, url, peers = await _sse_worker()
    try:
        connections = WorkerConnections(connect_s=5)
        for _ in range(5):
            chunks = [c async for c in stream_generate(connections, slot=0, url=url, body={"input_ids": [1]},
                                                       timeouts=Timeouts())]
            assert [c["output_ids"] for c in chunks] == [[0], [0, 1]]
        connections.close()
    finally:
        await runner.cleanup()
    assert len(peers) == 1, f"{len(peers)} connections for 5 sequential streams"
