"""Shared pieces of the fault suite: a router config with short timeouts, references
from a fault-free emulator, and waiting on events instead of sleeping."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any, Awaitable, Callable

import httpx

from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.dispatch import DispatchConfig
from pearl_sglang.workers.client import Timeouts
from tests.router.conftest import ADMIN_TOKEN
from tests.support.emulated import emulator

SLOW = ("--time-scale", "1")   # the tiny profile in real time: long outputs take seconds


def fault_config(*, chunk_s: float = 1.0, control_s: float = 2.0, max_attempts: int = 4,
                 route_wait_s: float = 2.0, **kw: Any) -> RouterConfig:
    """The router with timeouts short enough that a hung worker costs a test ~1 s."""
    base = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600)
    return replace(base, timeouts=Timeouts(connect_s=1.0, chunk_s=chunk_s, control_s=control_s),
                   dispatch=DispatchConfig(max_attempts=max_attempts, route_wait_s=route_wait_s,
                                           prefill_grace_s=2.0), **kw)


def long_body(prompt: list[int], n: int = 400, **extra: Any) -> dict[str, Any]:
    return {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}, **extra}


async def reference(body: dict[str, Any]) -> dict[str, Any]:
    """What a fault-free worker answers (emulated generation is deterministic)."""
    async with emulator("--time-scale", "50") as (url, _):
        async with httpx.AsyncClient(timeout=60) as c:
            r = await c.post(url + "/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def until(predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll a cheap in-process predicate (emulated engines expose no events for this)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def running(worker: Any) -> int:
    return worker.engine.loads().num_running_reqs


async def collect_sse(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                      on_chunk: Callable[[dict[str, Any]], Awaitable[None] | None] | None = None) -> list[Any]:
    events: list[Any] = []
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            event = data if data == "[DONE]" else json.loads(data)
            events.append(event)
            if on_chunk is not None and isinstance(event, dict):
                res = on_chunk(event)
                if res is not None:
                    await res
    return events


def assert_continuous(events: list[Any]) -> list[dict[str, Any]]:
    """One stream, never going backwards, ``[DONE]`` last; returns the chunks."""
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = events[:-1]
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"], "stream went backwards"
    assert all(ch["meta_info"]["finish_reason"] is None for ch in chunks[:-1])
    return chunks
