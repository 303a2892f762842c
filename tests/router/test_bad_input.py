"""Every malformed request gets a 4xx JSON error that names the problem; none is a 500."""
from __future__ import annotations

import httpx
import pytest

from tests.router.conftest import running_router, with_limits

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
])
async def test_generate_rejects_malformed(content, ctype, fragment):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        r = await _post(url + "/generate", content=content, headers={"Content-Type": ctype})
    assert 400 <= r.status_code < 500, r.text
    assert fragment in r.json()["error"]["message"]


@pytest.mark.parametrize("params,limit", [
    ({"max_new_tokens": 10_000_000}, "limit_max_new_tokens"),
    ({"n": 1000}, "limit_n"),
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
