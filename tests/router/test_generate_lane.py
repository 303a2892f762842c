"""The router's own HTTP path for plain ``/generate`` turns (``router.generate_lane``),
over raw loopback sockets and emulated workers: it answers what aiohttp's handler
answers (same statuses, bodies, content types and metrics, side by side with the lane
off), hands every other request (and the rest of its connection) to aiohttp, keeps
pipelined turns in order, bounds a body's arrival, stops a turn whose client hung up,
and closes its connections when the router stops."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.http1 import parse_head
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import ADMIN_TOKEN, running_router
from tests.support.emulated import emulator

FAST = ("--time-scale", "20")
SLOW = ("--time-scale", "1")


def _config(**kw) -> RouterConfig:
    return replace(RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600), **kw)


def _request(body: bytes | dict, *, path: str = "/generate", method: str = "POST",
             headers: dict[str, str] | None = None) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Host": "router", "Content-Type": "application/json", "Content-Length": str(len(raw)), **(headers or {})}
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + raw


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: router\r\n\r\n".encode()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer: status, headers (lower-case names), body (Content-Length or chunked)."""
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)).decode()
    lines = head.split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, headers, body
        body += chunk[:-2]


async def _exchange(port: int, *requests: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Each request in turn on one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answers = []
        for request in requests:
            writer.write(request)
            answers.append(await _answer(reader))
        return answers
    finally:
        writer.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _counted(app, status: str) -> float:
    return app[ROUTER].metrics.requests.labels("/generate", status)._value.get()


TURN = {"input_ids": [3, 1, 4, 1, 5, 9, 2, 6], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}


def test_parse_head_takes_plain_http11_heads_only():
    head = parse_head(b"POST /generate HTTP/1.1\r\nHost: x\r\ncontent-length: 12\r\nX-Pearl-Turn:  3 ")
    assert head is not None and head.method == b"POST" and head.target == b"/generate"
    assert head.headers["Content-Length"] == "12" and head.headers["x-pearl-turn"] == "3"
    for odd in (b"POST /generate HTTP/1.0\r\nHost: x", b"POST  /generate HTTP/1.1", b"POST /generate",
                b"POST /generate HTTP/1.1\r\nno colon here", b"POST /generate HTTP/1.1\r\nBad Name: 1",
                b"POST /generate HTTP/1.1\r\n folded: 1", b"POST /generate HTTP/1.1\r\nX-A: a\rb",
                b"POST /generate HTTP/1.1\r\nX-A: a\nb", b"POST /generate HTTP/1.1\r\nX-A: a\x00"):
        assert parse_head(odd) is None, odd


async def test_a_plain_turn_is_answered_by_the_lane_as_aiohttp_answers_it():
    async with emulator(*FAST) as (worker, _):
        answers = {}
        for lane in (True, False):
            async with running_router(regular=[worker], config=_config(generate_lane=lane)) as (url, app, _):
                ((status, headers, body),) = await _exchange(_port(url), _request({**TURN, "rid": f"r-{lane}"}))
                answers[lane] = (status, headers["content-type"], json.loads(body))
                assert _counted(app, "200") == 1
                lane_obj = app[ROUTER].connections.lane
                assert (lane_obj.answered if lane else lane_obj) == (1 if lane else None)
    (s1, t1, b1), (s0, t0, b0) = answers[True], answers[False]
    assert (s1, t1) == (s0, t0) == (200, "application/json")
    assert b1["output_ids"] == b0["output_ids"] and b1["text"] == b0["text"]
    assert b1["meta_info"]["id"] == "r-True" and set(b1["meta_info"]) == set(b0["meta_info"])


BAD = [  # (body, headers)
    (b'{"input_ids": [1, 2', {}),
    (b" " * 10, {}),
    (b"[1, 2]", {}),
    (json.dumps({"input_ids": []}).encode(), {}),
    (json.dumps({"input_ids": [1, -2]}).encode(), {}),
    (json.dumps({"text": 5}).encode(), {}),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}).encode(), {}),
    (json.dumps(TURN).encode(), {"X-Pearl-Turn": "one"}),
    (json.dumps(TURN).encode(), {"X-Pearl-Expected-Turns": "3"}),
    (json.dumps({**TURN, "input_ids": [[1, 2], [3]]}).encode(), {"X-Pearl-Trajectory-Id": "t"}),
    (json.dumps({**TURN, "rid": ["a", "b"]}).encode(), {}),
]


@pytest.mark.parametrize("case", range(len(BAD)))
async def test_bad_turns_get_the_same_answer_on_both_paths(case):
    raw, headers = BAD[case]
    async with emulator(*FAST) as (worker, _):
        answers = []
        for lane in (True, False):
            async with running_router(regular=[worker], config=_config(generate_lane=lane)) as (url, app, _):
                ((status, head, answer),) = await _exchange(_port(url), _request(raw, headers=headers))
                answers.append((status, head["content-type"], json.loads(answer)))
                assert _counted(app, str(status)) == 1
                if lane:
                    assert app[ROUTER].connections.lane.answered == 1
    assert answers[0] == answers[1]
    assert 400 <= answers[0][0] < 500, answers[0]


async def test_requests_the_lane_does_not_take_go_to_aiohttp_and_answer_the_same():
    key_config = replace(_config(), security=Security(admin_token=ADMIN_TOKEN, api_key="key"))
    key = {"X-Api-Key": "key"}
    cases = [
        (_request(TURN, headers={"Authorization": "Bearer wrong"}), 401),
        (_request(TURN, headers={**key, "Content-Type": "text/plain"}), 400),
        (_request({**TURN, "pad": "x" * 5000}, headers=key), 413),
        (_request(TURN, headers={**key, "Content-Encoding": "gzip"}), 400),
        (_request(TURN, path="/generate?x=1", headers=key), 200),
    ]
    async with emulator(*FAST) as (worker, _):
        for lane in (True, False):
            config = replace(key_config, generate_lane=lane,
                             limits=replace(key_config.limits, max_body_bytes=4096))
            async with running_router(regular=[worker], config=config) as (url, app, _):
                for request, status in cases:
                    ((got, _, body),) = await _exchange(_port(url), request)
                    assert got == status, (lane, request[:60], body)
                authorized = _request(TURN, headers={"Authorization": "Bearer key"})
                ((got, _, _),) = await _exchange(_port(url), authorized)
                assert got == 200
                if lane:
                    assert app[ROUTER].connections.lane.answered == 1
                    assert app[ROUTER].connections.lane.handed_over == len(cases)


async def test_one_connection_moves_to_aiohttp_for_other_requests_and_stays_served():
    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker]) as (url, app, _):
            lane = app[ROUTER].connections.lane
            stream = {**TURN, "stream": True}
            answers = await _exchange(_port(url), _request(TURN), _get("/health"), _request(stream), _request(TURN))
    assert [a[0] for a in answers] == [200, 200, 200, 200]
    events = [line for line in answers[2][2].decode().split("\n") if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2
    assert json.loads(answers[3][2])["output_ids"] == json.loads(answers[0][2])["output_ids"]
    assert (lane.answered, lane.handed_over) == (1, 1)


def _events(body: bytes) -> list[str]:
    return [line for line in body.decode().split("\n") if line.startswith("data:")]


@pytest.mark.parametrize("batch", [False, True])
async def test_a_stream_is_answered_by_the_lane_as_aiohttp_answers_it(batch):
    ids = [[3, 1, 4, 1], [2, 7, 1, 8]] if batch else [3, 1, 4, 1]
    request = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}
    async with emulator(*FAST) as (worker, _):
        answers = []
        for lane in (True, False):
            async with running_router(regular=[worker], config=_config(generate_lane=lane)) as (url, app, _):
                ((status, headers, body),) = await _exchange(_port(url), _request({**request, "rid": "s"}
                                                                                  if not batch else request))
                answers.append((status, headers["content-type"], headers["cache-control"],
                                headers.get("transfer-encoding"), _events(body)))
                # Both paths count a stream as its last piece goes out: the client may see it first.
                await _until(lambda: _counted(app, "200") == 1)
                if lane:
                    await _until(lambda: app[ROUTER].connections.lane.answered == 1)
    assert answers[0][:4] == answers[1][:4] == (200, "text/event-stream; charset=utf-8", "no-cache", "chunked")
    lane_events, aiohttp_events = answers[0][4], answers[1][4]
    assert lane_events[-1] == aiohttp_events[-1] == "data: [DONE]"

    def last_of_each(events):  # chunks are cumulative: each item's last one is whole
        last = {}
        for e in events[:-1]:
            chunk = json.loads(e[len("data: "):])
            last[chunk.get("index", 0)] = (chunk["output_ids"], chunk["meta_info"]["finish_reason"])
        return last
    assert last_of_each(lane_events) == last_of_each(aiohttp_events)
    assert len(last_of_each(lane_events)) == (2 if batch else 1)


async def test_a_stream_over_the_per_client_limit_is_refused_on_both_paths():
    base = _config()
    long = {"input_ids": [3, 1, 4], "stream": True, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    async with emulator(*SLOW) as (worker, _):
        for lane in (True, False):
            config = replace(base, generate_lane=lane, limits=replace(base.limits, max_streams_per_client=1))
            async with running_router(regular=[worker], config=config) as (url, app, _):
                reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
                writer.write(_request(long))
                await reader.readuntil(b"data:")  # the first stream runs
                ((status, _, body),) = await _exchange(_port(url), _request(long))
                assert status == 429 and json.loads(body)["error"]["type"] == "limit_max_streams_per_client"
                writer.close()
                await _until(lambda: len(app[ROUTER].inflight) == 0)


async def test_a_client_that_leaves_a_stream_stops_its_turn_at_the_worker():
    long = {"input_ids": [3, 1, 4], "stream": True, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    async with emulator(*SLOW) as (worker, engine_host):
        async with running_router(regular=[worker]) as (url, app, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            writer.write(_request(long))
            await reader.readuntil(b"data:")
            writer.close()
            await _until(lambda: engine_host.engine.loads().num_running_reqs == 0)
            await _until(lambda: len(app[ROUTER].inflight) == 0)
            await _until(lambda: _counted(app, "200") == 1)  # its head was sent: a 200, as aiohttp counts it
            assert _counted(app, "499") == 0


async def test_pipelined_turns_are_answered_in_order():
    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker]) as (url, app, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            long_first = {**TURN, "rid": "first", "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
            writer.write(_request(long_first) + _request({**TURN, "rid": "second"}) + _get("/health"))
            answers = [await _answer(reader) for _ in range(3)]
            writer.close()
    assert [json.loads(a[2])["meta_info"]["id"] for a in answers[:2]] == ["first", "second"]
    assert answers[2][0] == 200


async def test_a_body_in_pieces_is_waited_for_and_one_that_stops_gets_408():
    config = replace(_config(), connections=replace(_config().connections, body_timeout_s=0.5))
    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker], config=config) as (url, app, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            request = _request(TURN)
            for piece in (request[:30], request[30:-10], request[-10:]):
                writer.write(piece)
                await asyncio.sleep(0.1)
            status, _, body = await _answer(reader)
            assert status == 200 and json.loads(body)["output_ids"]
            writer.write(_request(TURN)[:-5])
            status, headers, body = await _answer(reader)
            assert status == 408 and json.loads(body)["error"]["type"] == "body_timeout"
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()


async def test_connection_close_is_honoured():
    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker]) as (url, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            writer.write(_request(TURN, headers={"Connection": "close"}))
            status, headers, _ = await _answer(reader)
            assert (status, headers["connection"]) == (200, "close")
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()


async def _until(predicate, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_a_client_that_hangs_up_stops_its_turn_at_the_worker():
    async with emulator(*SLOW) as (worker, engine_host):
        async with running_router(regular=[worker]) as (url, app, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            writer.write(_request({**TURN, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}))
            await _until(lambda: engine_host.engine.loads().num_running_reqs == 1)
            writer.close()
            await _until(lambda: engine_host.engine.loads().num_running_reqs == 0)
            await _until(lambda: _counted(app, "499") == 1)
            assert len(app[ROUTER].inflight) == 0


async def test_stopping_closes_idle_lane_connections_and_ends_running_turns_with_close():
    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker]) as (url, app, _):
            idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", _port(url))
            idle_writer.write(_request(TURN))
            assert (await _answer(idle_reader))[0] == 200
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            writer.write(_request({**TURN, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}))
            await _until(lambda: len(app[ROUTER].inflight) == 1)
            app[ROUTER].connections.lane.stop_taking()
            assert await asyncio.wait_for(idle_reader.read(), 5) == b""
            status, headers, body = await _answer(reader)
            assert (status, headers["connection"]) == (200, "close")
            assert json.loads(body)["meta_info"]["completion_tokens"] == 200
            assert await asyncio.wait_for(reader.read(), 5) == b""
            # A new connection now goes to aiohttp, which still answers until the site stops.
            ((status, _, _),) = await _exchange(_port(url), _request(TURN))
            assert status == 200 and app[ROUTER].connections.lane.answered == 2
            for w in (idle_writer, writer):
                w.close()


async def test_an_unexpected_error_is_a_logged_500_on_both_paths(monkeypatch, caplog):
    from pearl_sglang.router import generate_lane, inference_routes

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(generate_lane, "parse_generate", broken)
    monkeypatch.setattr(inference_routes, "parse_generate", broken)
    async with emulator(*FAST) as (worker, _):
        answers = []
        for lane in (True, False):
            async with running_router(regular=[worker], config=_config(generate_lane=lane)) as (url, app, _):
                ((status, head, body),) = await _exchange(_port(url), _request(TURN))
                answers.append((status, head["content-type"], json.loads(body)))
                assert _counted(app, "500") == 1
    assert answers[0] == answers[1]
    assert answers[0][0] == 500 and answers[0][2]["error"]["type"] == "internal_error"
    assert sum("unhandled error on POST /generate" in r.message for r in caplog.records) == 2


async def test_idle_lane_connections_close_after_the_keepalive_and_keep_tcp_keepalive_on():
    import socket

    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker]) as (url, app, _):
            lane = app[ROUTER].connections.lane
            lane.keepalive_s = 0.4  # the sweep runs every keepalive_s / 4
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            writer.write(_request(TURN))
            assert (await _answer(reader))[0] == 200
            (door,) = lane.doors
            sock = door.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", _port(url))
            busy_writer.write(_request({**TURN, "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}))
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the idle one closed
            status, _, body = await _answer(busy_reader)  # the busy one is answered whole
            assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 60
            for w in (writer, busy_writer):
                w.close()


async def test_a_turns_bookkeeping_follows_its_answer_and_precedes_the_next_turn(monkeypatch):
    """The completion's bookkeeping (telemetry, loads owed, metrics) is off the answer's
    path: it runs once the answer is written, and before the trajectory's next turn,
    pipelined on the same connection, is routed (so that turn sees the last one ended)."""
    from pearl_sglang.router import generate_lane
    events: list[str] = []
    send_head = generate_lane.LaneDoor.send_head
    monkeypatch.setattr(generate_lane.LaneDoor, "send_head",
                        lambda self, *a, **k: (events.append("answer"), send_head(self, *a, **k))[1])
    async with emulator(*FAST) as (worker, _):
        async with running_router(regular=[worker]) as (url, app, _):
            dispatcher = app[ROUTER].dispatcher
            on_complete, route = dispatcher.on_complete, dispatcher.route

            def completed(done):
                events.append("complete")
                on_complete(done)

            async def routed(*a, **k):
                events.append("route")
                return await route(*a, **k)
            monkeypatch.setattr(dispatcher, "on_complete", completed)
            monkeypatch.setattr(dispatcher, "route", routed)
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(url))
            trajectory = {"X-Pearl-Trajectory-Id": "t-order"}
            writer.write(_request({**TURN, "rid": "one"}, headers=trajectory)
                         + _request({**TURN, "rid": "two"}, headers=trajectory))
            answers = [await _answer(reader) for _ in range(2)]
            writer.close()
    assert [a[0] for a in answers] == [200, 200]
    assert events == ["route", "answer", "complete", "route", "answer", "complete"]
