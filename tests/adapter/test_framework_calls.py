"""Each framework's rollout-path HTTP calls (tests/adapter/framework_calls.py), made in
order against PEARL's router in front of engines the framework launched (emulated here;
real SGLang on CPU in the realsglang lane) and registered through the worker API.

Every call must succeed, the requests in flight must end as the framework expects
(aborted with their partial output where it aborts, completed where it reshapes), and the
calls made must be exactly the listed ones, in that order.
"""
from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from urllib.parse import quote

import httpx
import pytest

from pearl_rl_adapter.shims.roll import patch_sglang_router
from pearl_rl_adapter.shims.router_abort import abort_through_router
from pearl_sglang.core.registered import RegistrationConfig
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.state import ROUTER
from tests.adapter import framework_calls as fc
from tests.router.conftest import running_router
from tests.support.emulated import emulator

SLOW = ("--time-scale", "1")


def _config() -> RouterConfig:
    return RouterConfig(security=Security(), health_interval_s=2.0,
                        registration=RegistrationConfig(startup_timeout_s=60, poll_interval_s=0.2))


class Replay:
    """Makes the calls and records them; ``check`` compares the record with the list."""

    def __init__(self, client: httpx.AsyncClient, router: str) -> None:
        self.client, self.router, self.made = client, router, []

    async def call(self, c: fc.Call, *, worker: str | None = None, path: str | None = None,
                   json=None, ok=(200, 202), record: bool = True) -> httpx.Response:
        """Record at the start (a call in flight is made); repeats in a row count once."""
        base = self.router if c.to == "router" else worker
        assert base, f"{c} needs a worker URL"
        if record and (not self.made or self.made[-1] != c):
            self.made.append(c)
        r = await self.client.request(c.method, base + (path or c.path), json=json)
        assert r.status_code in ok, (c, r.status_code, r.text[:500])
        return r

    def check(self, calls: tuple[fc.Call, ...]) -> None:
        assert tuple(self.made) == calls


async def _until_listed(rp: Replay, c: fc.Call, urls: set[str], timeout=120.0, record: bool = True,
                        healthy_only: bool = False) -> None:
    """Poll ``GET /workers`` until it lists exactly ``urls`` (ROLL compares every listed
    URL, router.py:62; the slime replay waits for healthy ones)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        body = (await rp.call(c, record=record)).json()
        if {w["url"] for w in body["workers"] if w["is_healthy"] or not healthy_only} == urls:
            return
        assert loop.time() < deadline, body
        await asyncio.sleep(0.2)


def _gen(i: int, n: int, rid: str | None = None) -> dict:
    body = {"input_ids": [5, i, 7, 11], "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True}
    if rid:
        body["rid"] = rid
    return body


async def _running(rp: Replay, timeout=20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not len(rp.app[ROUTER].inflight):
        assert loop.time() < deadline, "no request reached PEARL"
        await asyncio.sleep(0.01)


async def slime_step(rp: Replay, workers: list[str], model_path: str) -> None:
    calls = iter(fc.SLIME_CALLS)
    health, register, generate, list_, abort = (next(calls) for _ in range(5))
    for url in workers:
        await rp.call(health, worker=url)
    for url in workers:
        await rp.call(register, json={"url": url, "worker_type": "regular"})
    # slime does not wait for admission (its requests would); the test does, unrecorded.
    await _until_listed(rp, list_, set(workers), record=False, healthy_only=True)
    pending = [asyncio.ensure_future(rp.call(generate, json=_gen(i, 2000))) for i in range(4)]
    await _running(rp)
    urls = [w["url"] for w in (await rp.call(list_)).json()["workers"]]
    assert sorted(urls) == sorted(workers)
    await abort_through_router(rp.router)
    rp.made.append(abort)
    outs = [(await p).json() for p in pending]
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(out["output_ids"]) < 2000  # the partial sample slime keeps
    pause, flush, update, cont, release, resume, generate2, list2, delete = calls
    # Each engine call below runs on every engine at once (slime's ray.get over engines).
    await asyncio.gather(*(rp.call(pause, worker=url, json={}) for url in workers))
    await asyncio.gather(*(rp.call(flush, worker=url) for url in workers))
    await asyncio.gather(*(rp.call(update, worker=url, json={"model_path": model_path, "weight_version": "1"})
                           for url in workers))
    await asyncio.gather(*(rp.call(cont, worker=url, json={}) for url in workers))
    await asyncio.gather(*(rp.call(release, worker=url, json={}) for url in workers))
    await asyncio.gather(*(rp.call(resume, worker=url, json={"tags": None}) for url in workers))
    out = (await rp.call(generate2, json=_gen(9, 8))).json()
    assert len(out["output_ids"]) == 8 and out["meta_info"]["weight_version"] == "1"
    # Each engine's shutdown lists the router's workers and deletes its own entry.
    listed = [(await rp.call(list2)).json()["workers"] for _ in workers]
    for url, entries in zip(workers, listed):
        await rp.call(delete, path=f"/workers/{next(w['id'] for w in entries if w['url'] == url)}")
    rp.check(fc.SLIME_CALLS)


async def roll_step(rp: Replay, workers: list[str]) -> None:
    (list_, generate, delete, list2, post, list3, generate2, abort) = fc.ROLL_CALLS
    await _until_listed(rp, list_, set(workers))
    pending = [asyncio.ensure_future(rp.call(generate, json=_gen(i, 300, rid=f"roll-{i}"))) for i in range(4)]
    await _running(rp)
    shrink = workers[-1]
    await rp.call(delete, path=f"/workers/{quote(shrink, safe='')}")
    await _until_listed(rp, list2, set(workers) - {shrink})
    await rp.call(post, json={"url": shrink})
    await _until_listed(rp, list3, set(workers))
    outs = [(await p).json() for p in pending]
    # The removed engine's requests were moved by PEARL, with their partial output.
    assert all(len(o["output_ids"]) == 300 for o in outs)
    assert rp.app[ROUTER].dispatcher.migrations >= 1
    late = [asyncio.ensure_future(rp.call(generate2, json=_gen(20 + i, 2000, rid=f"roll-late-{i}")))
            for i in range(2)]
    await _running(rp)
    await abort_through_router(rp.router, rids=["roll-late-0", "roll-late-1"])
    rp.made.append(abort)
    for p in late:
        out = (await p).json()
        assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < 2000
    rp.check(fc.ROLL_CALLS)


async def verl_step(rp: Replay, workers: list[str]) -> None:
    (resume_w, flush, resume_kv, generate, release, add, generate2, remove) = fc.VERL_CALLS
    standalone = workers[-1]
    for url in workers[:-1]:
        await rp.call(release, worker=url, json={"tags": ["kv_cache", "weights"]})
    rp.made.clear()  # the previous step's sleep; the step starts at wake-up
    for url in workers[:-1]:
        await rp.call(resume_w, worker=url, json={"tags": ["weights"]})
        await rp.call(flush, worker=url)
        await rp.call(resume_kv, worker=url, json={"tags": ["kv_cache"]})
    outs = await asyncio.gather(*(rp.call(generate, json=_gen(i, 16)) for i in range(4)))
    assert all(len(o.json()["output_ids"]) == 16 for o in outs)
    for url in workers[:-1]:
        await rp.call(release, worker=url, json={"tags": ["kv_cache", "weights"]})
    r = await rp.call(add, path=f"/add_worker?url={standalone}")
    assert r.text == f"Successfully added worker: {standalone}"
    out = (await rp.call(generate2, json=_gen(30, 8))).json()
    assert len(out["output_ids"]) == 8
    await rp.call(remove, path=f"/remove_worker?url={standalone}")
    rp.check(fc.VERL_CALLS)


async def _deployment(stack: AsyncExitStack, n: int, *flags: str) -> list[str]:
    return [(await stack.enter_async_context(emulator(*SLOW, *flags)))[0] for _ in range(n)]


@pytest.mark.parametrize("framework", ["slime", "roll", "verl"])
async def test_framework_calls_against_pearl_over_emulated_engines(framework, tiny_model_dir):
    async with AsyncExitStack() as stack:
        if framework == "slime":
            workers = await _deployment(stack, 2, "--enable-memory-saver")
            attached: list[str] = []
        elif framework == "roll":
            workers = await _deployment(stack, 2)
            attached = workers  # ROLL starts its router with --worker-urls
        else:
            workers = await _deployment(stack, 2, "--enable-memory-saver")
            attached = workers[:-1]  # the hybrid replicas; the last one is a standalone engine
        async with running_router(regular=attached, config=_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=120) as c:
                rp = Replay(c, base)
                rp.app = app
                if framework == "slime":
                    await slime_step(rp, workers, str(tiny_model_dir))
                elif framework == "roll":
                    await roll_step(rp, workers)
                else:
                    await verl_step(rp, workers)


class StandInWorker:
    def __init__(self, url: str) -> None:
        self.url = url
        self.get_url = self

    async def remote(self) -> str:
        return self.url


class StandInSglangRouter:
    """ROLL v0.3.0's SglangRouter methods the patch keeps (router.py:755-785)."""

    def __init__(self, workers) -> None:
        self.workers = workers

    async def post_workers(self, urls):
        responses = await asyncio.gather(*[self.client.post(
            f"http://{self.router_ip}:{self.router_port}/workers", json={"url": url}) for url in urls])
        for r in responses:
            r.raise_for_status()


async def _wait_workflow(router_url, expected):
    async with httpx.AsyncClient() as client:
        while True:
            response = (await client.get(f"{router_url}/workers")).json()
            if {w["url"] for w in response["workers"]} == set(expected):
                return
            await asyncio.sleep(0.1)


async def test_roll_router_patch_registers_engines_with_pearl_and_aborts_there():
    async with AsyncExitStack() as stack:
        workers = await _deployment(stack, 2)
        async with running_router(config=_config()) as (base, app, store):
            cls = type("SglangRouter", (StandInSglangRouter,), {})
            restore = patch_sglang_router(cls, router_url=base, wait_workflow=_wait_workflow)
            router = cls([StandInWorker(u) for u in workers])
            await asyncio.wait_for(router.initialize(), 60)
            assert (router.router_ip, router.router_port) == ("127.0.0.1", int(base.rsplit(":", 1)[1]))
            assert sorted(w.endpoint for w in store.table.active()) == sorted(workers)
            async with httpx.AsyncClient(timeout=60) as c:
                pending = asyncio.ensure_future(c.post(base + "/generate", json=_gen(1, 2000, rid="r-1")))
                while not len(app[ROUTER].inflight):
                    await asyncio.sleep(0.01)
                await router.abort_requests(["r-1"], uid=None)
                out = (await pending).json()
            assert out["meta_info"]["finish_reason"]["type"] == "abort"
            await router.client.aclose()
            await router.abort_all_worker(workers[0])  # a no-op under PEARL
            restore()
            assert "initialize" not in cls.__dict__ and "abort_all_worker" not in cls.__dict__
