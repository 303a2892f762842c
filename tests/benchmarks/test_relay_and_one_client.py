"""The router benchmark's floor (a byte relay) and its one-client cell, which sends each
body to every target in turn."""
from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web

from benchmarks.harness import relay
from benchmarks.router_agentic import Workload, one_client_interleaved
from pearl_sglang.control.processes import free_port


async def _upstream(name: str, seen: list[tuple[str, bytes]]) -> tuple[web.AppRunner, str]:
    async def echo(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append((name, body))
        if request.headers.get("X-Stream"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            for i in range(3):
                await resp.write(b"data: %d\n\n" % i)
            await resp.write_eof()
            return resp
        return web.Response(body=name.encode() + b":" + body)

    async def generate(request: web.Request) -> web.Response:
        seen.append((name, await request.read()))
        return web.json_response({"output_ids": [1, 2, 3], "served_by": name})

    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/echo", echo)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_the_relay_copies_every_byte_and_takes_the_upstreams_in_turn_per_connection():
    seen: list[tuple[str, bytes]] = []
    ups = [await _upstream(n, seen) for n in ("a", "b")]
    port = free_port()
    task = asyncio.ensure_future(relay.serve("127.0.0.1", port, [("127.0.0.1", int(u.rsplit(":", 1)[1]))
                                                                  for _, u in ups]))
    try:
        for _ in range(50):  # the relay is listening
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.02)
        seen.clear()
        big = bytes(range(256)) * 8192  # 2 MiB: more than the relay buffers before it pauses
        answers = []
        for _ in range(2):  # one connection each: the first goes to one upstream, the next to the other
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
                for data in (b"x", big):  # keep-alive: both on the same connection, so the same upstream
                    async with s.post(f"http://127.0.0.1:{port}/echo", data=data) as r:
                        answers.append(await r.read())
                async with s.post(f"http://127.0.0.1:{port}/echo", data=b"s", headers={"X-Stream": "1"}) as r:
                    assert await r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        names = [n for n, _ in seen]
        assert names[:3] == [names[0]] * 3 and names[3:] == [names[3]] * 3 and names[0] != names[3]
        assert answers[1] == names[0].encode() + b":" + big and answers[3] == names[3].encode() + b":" + big
    finally:
        task.cancel()
        for runner, _ in ups:
            await runner.cleanup()


async def test_one_client_sends_each_body_to_every_target_in_rotated_order_and_checks_the_replies():
    seen: list[tuple[str, bytes]] = []
    ups = [await _upstream(n, seen) for n in ("a", "b")]
    try:
        # "a" names this process as its router: the CPU spent while each of its turns waited is counted.
        targets = [SimpleNamespace(name=n, urls=[u], pid=pid)
                   for n, (_, u), pid in zip(("a", "b"), ups, (os.getpid(), None))]
        bodies = tuple((json.dumps({"n": i}).encode(),) for i in range(3))
        w = Workload("w", "nonstream", bodies, trajectory=False)
        async with aiohttp.ClientSession() as s:
            out = await one_client_interleaved(s, targets, w, max_requests=4, max_s=30, expect={}, max_new=3)
        assert {name: r["n"] for name, r in out.items()} == {"a": 4, "b": 4}
        assert all(r["p50_ms"] > 0 and r["rps"] > 0 for r in out.values())
        assert out["a"]["router_cpu_ms_while_waited"] > 0 and "router_cpu_ms_while_waited" not in out["b"]
        order = [n for n, _ in seen]
        assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]  # each body to both, who goes first rotating
        assert [b for _, b in seen][::2] == [b for _, b in seen][1::2]
        async with aiohttp.ClientSession() as s:  # a target whose reply is not max_new ids long fails the run
            with pytest.raises(RuntimeError, match="differ or are not 4 long"):
                await one_client_interleaved(s, targets, w, max_requests=1, max_s=30, expect={}, max_new=4)
    finally:
        for runner, _ in ups:
            await runner.cleanup()
