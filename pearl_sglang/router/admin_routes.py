"""Router-level, informational and admin endpoints (no request generation here)."""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pearl_sglang.core.registered import is_registered, relaunch_lock
from pearl_sglang.core.state import Role
from pearl_sglang.router.errors import ServiceUnavailable
from pearl_sglang.router.state import ROUTER
from pearl_sglang.workers.errors import WorkerError


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readiness(request: web.Request) -> web.Response:
    st = request.app[ROUTER]
    table = st.store.table
    open_slots = st.breakers.open_slots()
    pushes = st.selector.pushes()
    stale = sorted(w.slot for w in table.active() if pushes is not None and not pushes.servable(w.weight_version))
    routable = [w for w in table.active() if w.slot not in open_slots and w.slot not in stale]
    roles = {w.role for w in routable}
    # Ready means a request can be served now: a colocated worker, or both halves of a PD
    # pair, with closed circuits and weights within the staleness bound (routing skips an
    # ACTIVE worker whose circuit is open, or that missed pushes).
    ready = Role.COLOCATED in roles or (Role.PREFILL in roles and Role.DECODE in roles)
    pd_roles = roles & {Role.PREFILL, Role.DECODE}
    missing = ([] if ready else [r.value for r in (Role.PREFILL, Role.DECODE) if r not in roles] if pd_roles
               else [Role.COLOCATED.value])
    body = {"status": "ready" if ready else "not_ready", "healthy_workers": len(routable),
            "total_workers": len(table.rollout_workers()), "topology": table.active_topology().label(),
            "open_circuits": sorted(open_slots), "stale_workers": stale, "missing_roles": missing,
            "admission_open": st.gate.is_open}
    return web.json_response(body, status=200 if ready else 503)


def _any_active(request: web.Request):
    st = request.app[ROUTER]
    table = st.store.table
    workers = table.active(Role.COLOCATED) or table.active(Role.DECODE) or table.active()
    if not workers:
        raise ServiceUnavailable("no active worker to ask", kind="no_worker")
    return workers[0]


async def _proxy_get(request: web.Request, path: str) -> web.Response:
    st = request.app[ROUTER]
    worker = _any_active(request)
    timeout = aiohttp.ClientTimeout(total=st.config.timeouts.control_s)
    try:
        async with st.session.get(worker.endpoint + path, timeout=timeout) as resp:
            data = await resp.read()
            return web.Response(status=resp.status, body=data,
                                content_type=resp.headers.get("Content-Type", "application/json").split(";")[0])
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ServiceUnavailable(f"worker {worker.slot} did not answer {path}: {e!r}") from e


async def health_generate(request: web.Request) -> web.Response:
    """Like SGLang's: an empty 200 when a generation can be served now. Every routable
    worker runs its own ``/health_generate`` concurrently; the answer is 200 when those that
    passed make a servable topology (a colocated worker, or a prefill and a decode)."""
    st = request.app[ROUTER]
    open_slots = st.breakers.open_slots()
    workers = [w for w in st.store.table.active() if w.endpoint and w.slot not in open_slots]
    timeout = aiohttp.ClientTimeout(total=st.config.timeouts.control_s)

    async def one(w) -> str:
        try:
            async with st.session.get(w.endpoint + "/health_generate", timeout=timeout) as resp:
                return "ok" if resp.status == 200 else f"HTTP {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return repr(e)

    results = await asyncio.gather(*(one(w) for w in workers))
    roles = {w.role for w, r in zip(workers, results) if r == "ok"}
    if Role.COLOCATED in roles or {Role.PREFILL, Role.DECODE} <= roles:
        return web.Response(status=200)
    detail = {str(w.slot): r for w, r in zip(workers, results)}
    raise ServiceUnavailable(f"no servable set of workers passed /health_generate: {detail or 'no routable worker'}",
                             kind="no_worker")


async def model_info(request: web.Request) -> web.Response:
    return await _proxy_get(request, "/model_info")


async def models(request: web.Request) -> web.Response:
    return await _proxy_get(request, "/v1/models")


async def server_info(request: web.Request) -> web.Response:
    st = request.app[ROUTER]
    resp = await _proxy_get(request, "/server_info")
    try:
        import json

        info = json.loads(resp.body)
    except ValueError:
        return resp
    info["pearl"] = {"policy": st.config.policy, "topology": st.store.table.active_topology().label(),
                     "workers": len(st.store.table.active())}
    return web.json_response(info)


async def flush_cache(request: web.Request) -> web.Response:
    st = request.app[ROUTER]
    workers = st.store.table.active()

    async def one(w):
        try:
            await st.workers.post_json(slot=w.slot, url=w.endpoint, path="/flush_cache", body=None)
            return str(w.slot), "flushed"
        except WorkerError as e:
            return str(w.slot), str(e)

    results = dict(await asyncio.gather(*(one(w) for w in workers)))
    ok = all(v == "flushed" for v in results.values())
    return web.json_response({"success": ok, "workers": results}, status=200 if ok else 409)


async def pearl_state(request: web.Request) -> web.Response:
    st = request.app[ROUTER]
    return web.json_response({
        "table": st.store.table.to_dict(),
        "topology": st.store.table.active_topology().label(),
        "inflight": len(st.inflight),
        "admission": {"open": st.gate.is_open, "waiting": st.gate.waiting, "reason": st.gate.reason},
        "open_circuits": sorted(st.breakers.open_slots()),
        "migrations": st.dispatcher.migrations,
        "telemetry_pending_turns": st.telemetry.pending(),
        "critical_path": _critical_path(st),
        "policy": st.config.policy,
        "routing": {**st.selector.state(), "loads": st.loads.state(asyncio.get_running_loop().time())},
        "utilization": st.utilization.state(),
        "control": st.control.state_report() if st.control is not None else None,
        "registered": _registered(st),
    })


def _critical_path(st) -> dict:
    """The step's running trajectories and those expected to finish last."""
    now = asyncio.get_running_loop().time()
    share = st.config.straggler_share
    return {"running": len(st.telemetry.progress(now)), "share": share,
            "history_trajectories": len(st.telemetry.history.turn_counts),
            "stragglers": [e.to_dict() for e in st.telemetry.stragglers(now, share=share)]}


def _registered(st) -> dict:
    """Workers registered through the worker API, and which changes PEARL will not make to
    them (they need a relaunch, and PEARL did not launch them)."""
    lock = relaunch_lock(st.store.table)
    return {"slots": [w.slot for w in st.store.table.rollout_workers() if is_registered(w)],
            "excluded_changes": (["colocated <-> PD (needs a relaunch)"] if lock else []),
            "mode_lock": lock.to_dict() if lock else None}


async def metrics(request: web.Request) -> web.Response:
    st = request.app[ROUTER]
    st.metrics.inflight.set(len(st.inflight))
    st.metrics.admission_waiting.set(st.gate.waiting)
    body = generate_latest(st.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
