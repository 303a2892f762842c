"""Small synchronous HTTP helpers for protocol tests (httpx, loopback only)."""
from __future__ import annotations

import json
from typing import Any, Iterator

import httpx

TIMEOUT = httpx.Timeout(300.0, connect=10.0)


def post(url: str, body: Any = None, **kw) -> httpx.Response:
    return httpx.post(url, json=body, timeout=kw.pop("timeout", TIMEOUT), **kw)


def get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, timeout=kw.pop("timeout", TIMEOUT), **kw)


def sse_events(url: str, body: Any, timeout: httpx.Timeout = TIMEOUT) -> list[Any]:
    """POST and collect the SSE ``data:`` payloads; ``[DONE]`` is kept as the string."""
    return list(iter_sse(url, body, timeout))


def iter_sse(url: str, body: Any, timeout: httpx.Timeout = TIMEOUT) -> Iterator[Any]:
    with httpx.stream("POST", url, json=body, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            yield data if data == "[DONE]" else json.loads(data)
