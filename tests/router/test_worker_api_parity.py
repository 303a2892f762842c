"""The same worker-API calls against the real sglang-router 0.3.2 and PEARL's router, in
front of the same emulated workers; their answers are compared field by field.

The real router comes from the CPU stack (scripts/setup_sglang_cpu.sh); the test is
skipped, saying so, where the stack is missing.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from benchmarks.harness.servers import SglangCpuStack
from pearl_sglang.control.processes import free_port
from pearl_sglang.core.registered import RegistrationConfig
from pearl_sglang.router.config import RouterConfig, Security
from tests.router.conftest import running_router
from tests.support.emulated import emulator

pytestmark = pytest.mark.realsglang
STACK_DIR = Path(__file__).resolve().parents[2] / ".sglang-cpu"
FAST = ("--time-scale", "20")
# What sglang-router 0.3.2 reports per worker; PEARL adds its own "pearl" entry.
WORKER_KEYS = {"id", "url", "model_id", "priority", "cost", "worker_type", "is_healthy", "load",
               "connection_mode", "metadata", "disable_health_check"}
COMPARED = ("url", "model_id", "priority", "cost", "worker_type", "is_healthy", "load", "connection_mode",
            "metadata", "disable_health_check", "bootstrap_port")


def _router_python() -> tuple[str, dict[str, str]]:
    try:
        stack = SglangCpuStack.load(STACK_DIR)
    except (OSError, ValueError, KeyError) as e:
        pytest.skip(f"the real sglang-router needs the CPU stack ({e}); run scripts/setup_sglang_cpu.sh")
    return stack.python, dict(stack.env)


@contextlib.asynccontextmanager
async def sglang_router(*worker_args: str, api_key: str | None = None):
    python, env = _router_python()
    port = free_port()
    argv = [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1", "--log-level", "warn",
            "--health-check-interval-secs", "2", *worker_args]
    if api_key:
        argv += ["--api-key", api_key]
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    r = await c.get(base + "/workers", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
                    if r.status_code == 200 and all(w["is_healthy"] for w in r.json()["workers"]) \
                            and r.json()["total"] >= 1:
                        break
                if proc.poll() is not None or loop.time() > deadline:
                    raise AssertionError(f"sglang-router did not start: {proc.stderr.read()[-2000:]!r}")
                await asyncio.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _pearl_config(api_key: str | None = None) -> RouterConfig:
    return RouterConfig(security=Security(api_key=api_key), health_interval_s=2.0,
                        registration=RegistrationConfig(startup_timeout_s=30, poll_interval_s=0.2))


async def _listed(c, base, url, timeout=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        workers = (await c.get(base + "/workers")).json()["workers"]
        hit = [w for w in workers if w["url"] == url and w["is_healthy"]]
        if hit:
            return hit[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never listed healthy on {base}")


async def _gone(c, base, url, timeout=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if url not in {w["url"] for w in (await c.get(base + "/workers")).json()["workers"]}:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} still listed on {base}")


def _same_worker(real: dict, ours: dict) -> None:
    assert WORKER_KEYS <= set(real) and WORKER_KEYS <= set(ours), (real, ours)
    assert set(real) - {"job_status"} <= set(ours), set(real) - set(ours)
    for key in COMPARED:
        assert real.get(key) == ours.get(key), (key, real.get(key), ours.get(key))
    uuid.UUID(ours["id"])


async def _script(c: httpx.AsyncClient, base: str, new_url: str) -> dict:
    """One framework-like sequence; returns what to compare."""
    out: dict = {}
    r = await c.get(base + "/workers")
    out["list0"] = (r.status_code, r.json())
    r = await c.post(base + "/workers", json={"url": new_url})
    out["add"] = (r.status_code, r.json(), r.headers.get("Location"))
    out["added"] = await _listed(c, base, new_url)
    r = await c.get(base + f"/workers/{out['added']['id']}")
    out["get"] = (r.status_code, r.json())
    r = await c.get(base + "/workers")
    out["list1"] = (r.status_code, r.json())
    # Each bad request on a connection of its own: after a 4xx sglang-router may close a
    # kept-alive connection, and a reused one then reads "Server disconnected" (a flake of the
    # reference side, not an answer to compare).
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as once:
        bad = await _bad_requests(once, base)
    out["bad"] = bad
    worker_id = out["added"]["id"]
    r = await c.delete(base + f"/workers/{worker_id}")
    out["delete"] = (r.status_code, r.json())
    await _gone(c, base, new_url)
    out["delete_again"] = (await c.delete(base + f"/workers/{worker_id}")).status_code
    r = await c.get(base + "/workers")
    out["list2"] = (r.status_code, r.json())
    return out


async def _bad_requests(c: httpx.AsyncClient, base: str) -> dict:
    bad = {}
    bad["no_url"] = (await c.post(base + "/workers", json={})).status_code
    bad["url_type"] = (await c.post(base + "/workers", json={"url": 5})).status_code
    bad["not_json"] = (await c.post(base + "/workers", content=b"nojson",
                                    headers={"Content-Type": "application/json"})).status_code
    bad["no_ctype"] = (await c.post(base + "/workers", content=b'{"url": "http://127.0.0.1:1"}')).status_code
    r = await c.get(base + "/workers/not-a-uuid")
    bad["bad_id"] = (r.status_code, r.json()["code"])
    r = await c.get(base + "/workers/00000000-0000-0000-0000-000000000000")
    bad["unknown_id"] = (r.status_code, r.json())
    r = await c.delete(base + "/workers/00000000-0000-0000-0000-000000000000")
    bad["delete_unknown"] = (r.status_code, r.json())
    return bad


def _compare(real: dict, ours: dict, *, new: str) -> None:
    for key in ("list0", "list1", "list2"):
        (rs, rb), (os_, ob) = real[key], ours[key]
        assert rs == os_ == 200
        assert rb["total"] == ob["total"] and rb["stats"] == ob["stats"]
        by_url = {w["url"]: w for w in ob["workers"]}
        assert set(by_url) == {w["url"] for w in rb["workers"]}
        for w in rb["workers"]:
            _same_worker(w, by_url[w["url"]])
    (rs, rb, rloc), (os_, ob, oloc) = real["add"], ours["add"]
    assert rs == os_ == 202
    assert set(rb) == set(ob) and rb["status"] == ob["status"] and rb["url"] == ob["url"] == new
    assert rb["message"] == ob["message"]
    assert rloc == rb["location"] == f"/workers/{rb['worker_id']}" and oloc == ob["location"] == \
        f"/workers/{ob['worker_id']}"
    _same_worker(real["added"], ours["added"])
    assert real["get"][0] == ours["get"][0] == 200
    _same_worker(real["get"][1], ours["get"][1])
    for key, value in real["bad"].items():  # statuses; for unknown ids the bodies too
        assert value == ours["bad"][key], (key, value, ours["bad"][key])
    rs, rb = real["delete"]
    os_, ob = ours["delete"]
    assert rs == os_ == 202 and set(rb) == set(ob) and rb["status"] == ob["status"]
    assert rb["message"] == ob["message"]
    assert real["delete_again"] == ours["delete_again"] == 404


async def test_worker_api_answers_as_sglang_router_does():
    async with emulator(*FAST) as (u0, _), emulator(*FAST) as (u1, _):
        async with sglang_router("--worker-urls", u0) as real_base:
            async with httpx.AsyncClient(timeout=30) as c:
                real = await _script(c, real_base, u1)
        async with running_router(regular=[u0], config=_pearl_config()) as (base, app, store):
            async with httpx.AsyncClient(timeout=30) as c:
                ours = await _script(c, base, u1)
    _compare(real, ours, new=u1)


async def test_pd_workers_and_api_key_answer_as_sglang_router_does():
    pport, extra_port = free_port(), free_port()
    async with emulator("--disaggregation-mode", "prefill", *FAST, bootstrap_port=pport) as (up, _), \
            emulator("--disaggregation-mode", "decode", *FAST) as (ud, _), \
            emulator("--disaggregation-mode", "prefill", *FAST, bootstrap_port=extra_port) as (up2, _):
        results = {}
        key = "parity-key"
        auth = {"Authorization": f"Bearer {key}"}
        async with sglang_router("--pd-disaggregation", "--prefill", up, str(pport), "--decode", ud,
                                 api_key=key) as real_base:
            results["real"] = await _pd_script(real_base, up2, extra_port, auth)
        async with running_router(prefill=[(up, pport)], decode=[ud], config=_pearl_config(api_key=key)) \
                as (base, app, store):
            results["ours"] = await _pd_script(base, up2, extra_port, auth)
    real, ours = results["real"], results["ours"]
    assert real["unauthorized"] == ours["unauthorized"] == [401, 401]
    assert real["add"] == ours["add"] == 202
    rb, ob = real["list"], ours["list"]
    assert rb["stats"] == ob["stats"] == {"prefill_count": 2, "decode_count": 1, "regular_count": 0}
    by_url = {w["url"]: w for w in ob["workers"]}
    for w in rb["workers"]:
        _same_worker(w, by_url[w["url"]])
    assert by_url[up2]["bootstrap_port"] == extra_port and by_url[up]["bootstrap_port"] == pport


async def _pd_script(base: str, new_prefill: str, port: int, auth: dict) -> dict:
    out: dict = {}
    async with httpx.AsyncClient(timeout=30) as c:
        out["unauthorized"] = [(await c.get(base + "/workers")).status_code,
                               (await c.post(base + "/workers", json={"url": new_prefill})).status_code]
    async with httpx.AsyncClient(timeout=30, headers=auth) as c:
        r = await c.post(base + "/workers", json={"url": new_prefill, "worker_type": "prefill",
                                                  "bootstrap_port": port})
        out["add"] = r.status_code
        await _listed(c, base, new_prefill)
        out["list"] = (await c.get(base + "/workers")).json()
    return out
