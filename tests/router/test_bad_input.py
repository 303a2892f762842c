"""Every malformed request gets a 4xx JSON error that names the problem; none is a 500."""
from __future__ import annotations

import gzip

import httpx
import pytest

from tests.router.conftest import running_router, with_limits
from tests.support.emulated import emulator

DEAD_WORKER = "http://127.0.0.1:9"  # discard port: nothing listens there


async def _post(url, **kw):
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.post(url, **kw)


@pytest.mark.parametrize("content,ctype,fragment", [
    (b"{not json", "application/json", "malformed JSON"),
    (b"", "application/json", "empty"),
    (b"[1, 2]", "application/json", "JSON object"),
    (b'{"text": 5}', "application/json", "'text'"),
    (b'{"text": "x", "input_ids": [1]}', "application/json", "exactly one"),
    (b'{"input_ids": [1, -2]}', "application/json", "non-negative"),
    (b'{"text": "x", "sampling_params": {"max_new_tokens": "8"}}', "application/json", "integer"),
    (b'{"text": "x", "sampling_params": {"max_new_tokens": 8.0}}', "application/json", "integer"),
    (b'{"text": "x", "stream": "yes"}', "application/json", "'stream'"),
    (b'{"text": ["a", "b"], "rid": ["only-one"]}', "application/json", "'rid'"),
    (b'{"text": "x", "input_embeds": [[0.1]]}', "application/json", "input_embeds"),
    (b'{"text": "x"}', "text/plain", "Content-Type"),
    (b'{"text": "x", "return_logprob": []}', "application/json", "for a batch only"),
    (b'{"text": ["a", "b"], "return_logprob": [true]}', "application/json", "one entry per prompt"),
    (b'{"text": "x", "sampling_params": {"min_new_tokens": "3"}}', "application/json", "integer"),
    (b'{"text": "x", "sampling_params": {"min_new_tokens": 1e300}}', "application/json", "integer"),
])
async def test_generate_rejects_malformed(content, ctype, fragment):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + "/generate", content=content, headers={"Content-Type": ctype})
    assert 400 <= r.status_code < 500, r.text
    assert fragment in r.json()["error"]["message"]


@pytest.mark.parametrize("params,limit", [
    ({"max_new_tokens": 10_000_000}, "limit_max_new_tokens"),
    ({"n": 1000}, "limit_n"),
    ({"min_new_tokens": 10_000_000}, "limit_max_new_tokens"),
])
async def test_limits_are_named(params, limit):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + "/generate", json={"text": "x", "sampling_params": params})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == limit


async def test_batch_size_limit():
    async with running_router(regular=[DEAD_WORKER], config=with_limits(max_batch_size=4)) as (url, _, _):
        r = await _post(url + "/generate", json={"input_ids": [[1]] * 5})
    assert r.status_code == 400 and r.json()["error"]["type"] == "limit_max_batch_size"


async def test_oversized_body_is_413():
    async with running_router(regular=[DEAD_WORKER], config=with_limits(max_body_bytes=1024)) as (url, _, _):
        r = await _post(url + "/generate", json={"text": "x" * 5000})
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "limit_max_body_bytes"


async def test_unknown_endpoint_and_method():
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            missing = await c.get(url + "/nope")
            wrong = await c.get(url + "/generate")
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    assert wrong.status_code == 405 and wrong.json()["error"]["message"]


async def test_admin_endpoints_need_the_token(admin_headers):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            anonymous = await c.get(url + "/pearl/state")
            wrong = await c.get(url + "/pearl/state", headers={"Authorization": "Bearer nope"})
            flush = await c.post(url + "/flush_cache")
            ok = await c.get(url + "/pearl/state", headers=admin_headers)
    assert anonymous.status_code == 401 and wrong.status_code == 401 and flush.status_code == 401
    assert "admin token" in anonymous.json()["error"]["message"]
    assert ok.status_code == 200 and ok.json()["table"]["workers"][0]["endpoint"] == DEAD_WORKER


async def test_abort_request_validation():
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + "/abort_request", json={"rid": 3})
    assert r.status_code == 400 and "rid" in r.json()["error"]["message"]


async def test_unreachable_worker_is_an_explicit_error_not_a_hang():
    from pearl_sglang.router.config import RouterConfig, Security
    from pearl_sglang.router.dispatch import DispatchConfig

    config = RouterConfig(security=Security(admin_token="t"), health_interval_s=3600,
                          dispatch=DispatchConfig(max_attempts=2, route_wait_s=1.0))
    async with running_router(regular=[DEAD_WORKER], config=config) as (url, _, _):
        r = await _post(url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code in (502, 503)
    assert r.json()["error"]["message"]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [100, 256, 1000, 1100])
@pytest.mark.parametrize("path,template", [
    ("/generate", '{"text": "hi", "custom_labels": %s}'),
    ("/generate", '{"text": "hi", "stream": true, "custom_labels": %s}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "x": %s}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "stream": true, "x": %s}'),
    ("/v1/completions", '{"prompt": "hi", "x": %s}'),
    ("/abort_request", '{"rid": "r", "x": %s}'),
])
async def test_deep_json_is_a_named_400_on_every_endpoint(path, template, depth):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + path, content=(template % _deep(depth)).encode(),
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["type"] == "limit_max_json_depth"


async def test_json_depth_limit_is_configurable():
    body = '{"text": "hi", "custom_labels": %s}' % _deep(10)
    async with running_router(regular=[DEAD_WORKER], config=with_limits(max_json_depth=8)) as (url, _, _):
        r = await _post(url + "/generate", content=body.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "limit_max_json_depth"


@pytest.mark.parametrize("turn", [b"9" * 5000, "١٢".encode(), "²".encode(), b"-1", b"1.5", b"3 4", b"0x1"])
@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
async def test_bad_turn_header_is_a_400(path, body, turn):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + path, json=body, headers={"X-Pearl-Turn": turn})
    assert r.status_code == 400, r.text[:300]
    assert "X-Pearl-Turn" in r.json()["error"]["message"]


@pytest.mark.parametrize("headers", [
    {"X-Pearl-Trajectory-Id": "t", "X-Pearl-Expected-Turns": b"0"},
    {"X-Pearl-Trajectory-Id": "t", "X-Pearl-Expected-Turns": b"-3"},
    {"X-Pearl-Trajectory-Id": "t", "X-Pearl-Expected-Turns": b"2.5"},
    {"X-Pearl-Trajectory-Id": "t", "X-Pearl-Expected-Turns": b"9" * 10},
    {"X-Pearl-Trajectory-Id": "t", "X-Pearl-Expected-Turns": "١٢".encode()},
    {"X-Pearl-Expected-Turns": b"12"},  # a count without the trajectory it is of
])
@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
async def test_bad_expected_turns_header_is_a_400(path, body, headers):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + path, json=body, headers=headers)
    assert r.status_code == 400, r.text[:300]
    assert "X-Pearl-Expected-Turns" in r.json()["error"]["message"]


async def test_non_ascii_trajectory_header_is_a_400():
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + "/generate", json={"text": "hi"}, headers={"X-Pearl-Trajectory-Id": "trä".encode()})
    assert r.status_code == 400 and "X-Pearl-Trajectory-Id" in r.json()["error"]["message"]


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path,body,kind", [
    ("/v1/chat/completions", {**CHAT, "n": 1000}, "limit_n"),
    ("/v1/completions", {"prompt": "hi", "n": 1000}, "limit_n"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 10_000_000}, "limit_max_new_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 10_000_000}, "limit_max_new_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10_000_000}, "limit_max_new_tokens"),
    ("/v1/completions", {"prompt": ["a"] * 300, "n": 2}, "limit_max_batch_size"),
    ("/v1/completions", {"prompt": [[1, 2]] * 513}, "limit_max_batch_size"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 10_000_000}, "limit_max_new_tokens"),
    ("/v1/chat/completions", {**CHAT, "rid": "r" * 300}, "limit_max_rid_length"),
    ("/abort_request", {"rid": "r" * 300}, "limit_max_rid_length"),
])
async def test_openai_and_abort_endpoints_apply_the_documented_limits(path, body, kind):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + path, json=body)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["type"] == kind


@pytest.mark.parametrize("path,body,fragment", [
    ("/v1/chat/completions", {"messages": []}, "'messages'"),
    ("/v1/chat/completions", {**CHAT, "n": "2"}, "'n'"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, "'n'"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "'stream'"),
    ("/v1/completions", {"prompt": 5}, "'prompt'"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, "'max_tokens'"),
    # Found by the malformed-request fuzz: each of these was a 500, a worker crashed
    # mid-stream (and its circuit opened), or a repeated rid leaked in-flight load.
    ("/v1/chat/completions", {**CHAT, "rid": []}, "'rid'"),
    ("/v1/chat/completions", {**CHAT, "n": 2, "rid": ["dup", "dup"]}, "repeat"),
    ("/v1/chat/completions", {**CHAT, "n": 3, "rid": ["a", "b"]}, "one per choice"),
    ("/v1/completions", {"prompt": ["a", "b"], "rid": ["dup", "dup"]}, "repeat"),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": "yes"}, "'stream_options'"),
    ("/v1/chat/completions", {**CHAT, "n": 2, "stream": True, "stream_options": [1]}, "'stream_options'"),
    ("/v1/completions", {"prompt": "hi", "stream_options": 3}, "'stream_options'"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": "x"}, "'min_tokens'"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 1e300}, "'min_tokens'"),
])
async def test_openai_bodies_are_checked(path, body, fragment):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + path, json=body)
    assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text[:300]


@pytest.mark.parametrize("body,fragment", [({"prompt": ""}, "empty"), ({"prompt": []}, "'prompt'")])
async def test_an_empty_completion_prompt_is_a_400_not_a_502(body, fragment):
    """Found by the malformed-request fuzz: the worker's /tokenize returns no ids for an empty
    prompt, which the router once reported as a failed upstream."""
    async with emulator() as (worker, _), running_router(regular=[worker]) as (url, _, _):
        r = await _post(url + "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decode_by_its_content_encoding_is_a_400(encoding):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + "/generate", content=b'{"text": "hi"}',
                        headers={"Content-Type": "application/json", "Content-Encoding": encoding})
    assert r.status_code == 400, r.text
    assert "could not be read" in r.json()["error"]["message"]


async def test_a_gzip_body_is_read():
    async with emulator() as (worker, _), running_router(regular=[worker]) as (url, _, _):
        body = gzip.compress(b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}')
        r = await _post(url + "/generate", content=body,
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) == 2


@pytest.mark.parametrize("raw", [
    b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Bad\x01: 1\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
])
async def test_a_malformed_http_message_is_a_400_and_one_log_line(raw, caplog):
    """aiohttp logs a traceback at ERROR for each one; a peer could fill the log that way."""
    import asyncio
    import logging

    caplog.set_level(logging.INFO, logger="aiohttp.server")
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(200), 10)
        writer.close()
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records and all(r.levelno == logging.INFO and not r.exc_info for r in records), records
    assert "400" in records[0].getMessage()
