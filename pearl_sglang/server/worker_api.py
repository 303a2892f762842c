"""sglang-router's worker API, so RL frameworks that register their own engines can use
PEARL as a drop-in router.

Same paths, parameters and answers as sglang-router 0.3.2 (checked against the real one
by tests/router/test_worker_api_parity.py)::

    GET    /workers            {"workers": [...], "total", "stats"}
    POST   /workers            {"url", "worker_type"?, "bootstrap_port"?} -> 202, queued
    GET    /workers/{id}       one worker, with "job_status" while its job is known
    DELETE /workers/{id}       202, queued removal

and the legacy calls of earlier sglang-router releases that veRL still makes (0.3.2 itself
answers them 404): ``POST /add_worker?url=``, ``POST /remove_worker?url=``, ``GET
/list_workers``; these wait for the admission or the drain and answer plain text.

Worker ids are random UUIDs given once per URL, as in sglang-router. Adding and removing
go through ``control.registration``: health check, weight sync and atomic admission;
removal drains with partial output kept. With an admin token set, these routes need it.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from pearl_sglang.clock import Clock
from pearl_sglang.control.registration import (
    AlreadyRegistered, Capabilities, NotRegistered, Registrar, RegistrationError, WorkerSpec, find, normalize,
)
from pearl_sglang.core.registered import GPU_PREFIX
from pearl_sglang.core.state import Activity, Role, WorkerRecord, Zone
from pearl_sglang.router.errors import BadRequest, Conflict, RouterError, ServiceUnavailable
from pearl_sglang.router.middleware import read_json
from pearl_sglang.router.state import ROUTER

log = logging.getLogger("pearl.router.workers")

PATHS = ("/workers", "/add_worker", "/remove_worker", "/list_workers")
WORKER_TYPES = {"regular": Role.COLOCATED, "prefill": Role.PREFILL, "decode": Role.DECODE}
# PEARL's addition to the registration body: {"pearl": {"zone", "memory_saver", "pd_role_switch"}}.
# Preemptible GPUs are part of the dedicated zone (they join and leave with /pearl/gpus).
ZONES = {"dedicated": Zone.DEDICATED, "preemptible": Zone.DEDICATED, "overlap": Zone.OVERLAP}
TYPE_OF_ROLE = {role: name for name, role in WORKER_TYPES.items()}
# Workers PEARL launched are reshaped through /pearl/gpus, not removed by URL.
REMOVABLE_PREFIXES = (f"{GPU_PREFIX}-", "attached-")


class Unprocessable(RouterError):
    status = 422
    kind = "unprocessable_entity"


class UnsupportedMediaType(RouterError):
    status = 415
    kind = "unsupported_media_type"


class WorkerApiError(RouterError):
    """Errors that sglang-router answers as ``{"error": message, "code": CODE}``."""

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.kind}


class WorkerNotFound(WorkerApiError):
    status = 404
    kind = "WORKER_NOT_FOUND"


class InvalidWorkerId(WorkerApiError):
    status = 400
    kind = "BAD_REQUEST"


@dataclass
class WorkerApi:
    """Ids and background jobs of the worker API; the table stays the one record of
    which workers exist."""

    registrar: Registrar
    clock: Clock
    ids: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    tasks: set[asyncio.Task] = field(default_factory=set)

    def id_of(self, url: str) -> str:
        return self.ids.setdefault(normalize(url), str(uuid.uuid4()))

    def url_of(self, worker_id: str) -> str | None:
        return next((u for u, i in self.ids.items() if i == worker_id), None)

    def run(self, worker_id: str, job_type: str, url: str, coro) -> None:
        job = {"job_type": job_type, "worker_url": url, "status": "processing", "message": None,
               "timestamp": int(self.clock.epoch())}
        self.jobs[worker_id] = job

        async def body() -> None:
            try:
                await coro
                job["status"] = "completed"
            except RegistrationError as e:
                job.update(status="failed", message=str(e))
                log.warning("%s %s failed: %s", job_type, url, e)
            except Exception as e:  # noqa: BLE001 - recorded in the job, logged with traceback
                job.update(status="failed", message=repr(e))
                log.exception("%s %s failed", job_type, url)

        self._track(body())

    async def run_and_wait(self, url: str, coro) -> None:
        """Run a registration the caller waits for (the legacy calls); a router that stops
        cancels it, and the caller hears why instead of a cut connection."""
        task = self._track(coro)
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the caller itself was cancelled
            raise ServiceUnavailable(f"the router is stopping; {url} was not added", kind="stopping") from None

    def cancel_all(self) -> list[asyncio.Task]:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        return tasks

    def _track(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


WORKER_API = web.AppKey("pearl_worker_api", WorkerApi)


def _api(request: web.Request) -> WorkerApi:
    return request.app[WORKER_API]


def _healthy(request: web.Request, w: WorkerRecord) -> bool:
    st = request.app[ROUTER]
    return w.activity is Activity.ACTIVE and w.slot not in st.breakers.open_slots()


async def _metadata(request: web.Request, url: str) -> dict[str, str]:
    """What sglang-router reports from the worker's ``/server_info``, fetched once."""
    api = _api(request)
    if url in api.metadata:
        return api.metadata[url]
    st = request.app[ROUTER]
    try:
        async with st.session.get(url + "/server_info", timeout=aiohttp.ClientTimeout(total=5)) as r:
            info = await r.json(content_type=None) if r.status == 200 else {}
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return {}
    info = info if isinstance(info, dict) else {}
    meta = {k: str(info[k]) for k in ("model_path", "served_model_name", "tp_size", "dp_size",
                                      "disaggregation_mode") if info.get(k) is not None}
    api.metadata[url] = meta
    return meta


async def _describe(request: web.Request, w: WorkerRecord) -> dict[str, Any]:
    st = request.app[ROUTER]
    api = _api(request)
    meta = await _metadata(request, w.endpoint)
    out: dict[str, Any] = {
        "id": api.id_of(w.endpoint), "url": w.endpoint,
        "model_id": meta.get("served_model_name") or meta.get("model_path") or "unknown",
        "priority": 50, "cost": 1.0, "worker_type": TYPE_OF_ROLE.get(w.role, "regular"),
        "is_healthy": _healthy(request, w), "load": st.inflight.load().get(w.slot, 0),
        "connection_mode": "HTTP"}
    if w.role is Role.PREFILL:
        out["bootstrap_port"] = w.bootstrap_port
    caps = api.registrar.capabilities.get(w.endpoint)
    out.update(metadata=meta, disable_health_check=False,
               pearl={"slot": w.slot, "zone": w.zone.value, "activity": w.activity.value,
                      "pending_role": w.pending_role.value if w.pending_role else None,
                      "weight_version": w.weight_version,
                      "capabilities": caps.to_dict() if caps is not None else None})
    return out


def _listed(request: web.Request) -> list[WorkerRecord]:
    """Workers with an address that serve or will serve again (not retained, inactive ones)."""
    return [w for w in request.app[ROUTER].store.table.rollout_workers()
            if w.endpoint and w.activity is not Activity.INACTIVE]


async def list_workers(request: web.Request) -> web.Response:
    workers = _listed(request)
    roles = [w.role for w in workers]
    return web.json_response({
        "workers": [await _describe(request, w) for w in workers], "total": len(workers),
        "stats": {"prefill_count": roles.count(Role.PREFILL), "decode_count": roles.count(Role.DECODE),
                  "regular_count": roles.count(Role.COLOCATED)}})


def _pearl_fields(extra: Any) -> tuple[Zone, Capabilities]:
    if extra is None:
        return Zone.DEDICATED, Capabilities()
    if not isinstance(extra, dict):
        raise Unprocessable("'pearl' must be an object {zone, memory_saver, pd_role_switch}")
    zone = extra.get("zone", "dedicated")
    if not isinstance(zone, str) or zone not in ZONES:
        raise Unprocessable(f"'pearl.zone' must be one of {sorted(ZONES)}, got {zone!r}")
    flags = {}
    for key in ("memory_saver", "pd_role_switch"):
        value = extra.get(key)
        if value is not None and not isinstance(value, bool):
            raise Unprocessable(f"'pearl.{key}' must be true, false or null")
        flags[key] = value
    return ZONES[zone], Capabilities(**flags)


def _spec(request: web.Request, *, url: Any, worker_type: Any, bootstrap_port: Any, extra: Any = None) -> WorkerSpec:
    if not isinstance(url, str):
        raise Unprocessable("'url' is required and must be a string")
    if worker_type is None:
        worker_type = "regular"
    if not isinstance(worker_type, str) or worker_type not in WORKER_TYPES:
        raise Unprocessable(f"'worker_type' must be one of {sorted(WORKER_TYPES)}, got {worker_type!r}")
    if isinstance(bootstrap_port, str) and bootstrap_port.isascii() and bootstrap_port.isdigit():
        bootstrap_port = int(bootstrap_port)
    if bootstrap_port is not None and (isinstance(bootstrap_port, bool) or not isinstance(bootstrap_port, int)):
        raise Unprocessable("'bootstrap_port' must be an integer or null")
    zone, caps = _pearl_fields(extra)
    spec = WorkerSpec(url=url, role=WORKER_TYPES[worker_type],
                      bootstrap_port=bootstrap_port if worker_type != "regular" else None, zone=zone,
                      capabilities=caps)
    try:
        spec.validate()
    except ValueError as e:
        raise BadRequest(str(e), kind="invalid_worker") from e
    host = urlsplit(spec.url).hostname or ""
    if not request.app[ROUTER].config.security.worker_host_allowed(host):
        raise BadRequest(f"worker host {host!r} is not in --allowed-worker-hosts", kind="worker_host_not_allowed")
    return spec


async def create_worker(request: web.Request) -> web.Response:
    if "json" not in request.headers.get("Content-Type", ""):
        raise UnsupportedMediaType("Expected request with `Content-Type: application/json`")
    body = await read_json(request)
    if not isinstance(body, dict):
        raise Unprocessable("the body must be a JSON object with 'url'")
    spec = _spec(request, url=body.get("url"), worker_type=body.get("worker_type"),
                 bootstrap_port=body.get("bootstrap_port"), extra=body.get("pearl"))
    api = _api(request)
    url = normalize(spec.url)
    worker_id = api.id_of(url)
    api.run(worker_id, "AddWorker", url, api.registrar.add(spec))
    location = f"/workers/{worker_id}"
    return web.json_response({"status": "accepted", "worker_id": worker_id, "url": url, "location": location,
                              "message": "Worker addition queued for background processing"},
                             status=202, headers={"Location": location})


def _worker_id(request: web.Request) -> str:
    """A UUID, or (as earlier sglang-router releases took, and ROLL v0.3.0 sends) the
    worker's URL, percent-encoded."""
    raw = request.match_info["worker_id"]
    if raw.startswith(("http://", "https://")):
        api = _api(request)
        if normalize(raw) in api.ids:
            return api.ids[normalize(raw)]
        raise _not_found(raw)
    try:
        return str(uuid.UUID(raw))
    except ValueError as e:
        raise InvalidWorkerId(f"Invalid worker_id {raw!r} (expected UUID)") from e


def _not_found(worker_id: str) -> RouterError:
    return WorkerNotFound(f"Worker {worker_id} not found")


async def get_worker(request: web.Request) -> web.Response:
    api = _api(request)
    worker_id = _worker_id(request)
    url = api.url_of(worker_id)
    w = find(request.app[ROUTER].store.table, url) if url else None
    job = api.jobs.get(worker_id)
    if w is None and job is None:
        raise _not_found(worker_id)
    if w is not None:
        out = await _describe(request, w)
    else:
        out = {"id": worker_id, "url": url, "model_id": "unknown", "priority": 0, "cost": 1.0,
               "worker_type": "unknown", "is_healthy": False, "load": 0, "connection_mode": "unknown",
               "disable_health_check": False}
    if job is not None:
        out["job_status"] = dict(job)
    return web.json_response(out)


def _removable(request: web.Request, url: str) -> WorkerRecord:
    w = find(request.app[ROUTER].store.table, url)
    if w is None:
        raise NotRegistered(f"worker {url} is not registered")
    if not all(g.startswith(REMOVABLE_PREFIXES) for g in w.gpus):
        raise Conflict(f"PEARL launched worker {url}; give its GPUs back through POST /pearl/gpus "
                       "(action 'leave') instead", kind="launched_worker")
    return w


async def delete_worker(request: web.Request) -> web.Response:
    api = _api(request)
    worker_id = _worker_id(request)
    url = api.url_of(worker_id)
    try:
        w = _removable(request, url) if url else None
    except NotRegistered:
        w = None
    if w is None or w.activity is Activity.LEAVING:
        raise _not_found(worker_id)
    api.run(worker_id, "RemoveWorker", url, api.registrar.remove(url))
    return web.json_response({"status": "accepted", "worker_id": worker_id,
                              "message": "Worker removal queued for background processing"}, status=202)


# -- legacy API (sglang-router before 0.3): synchronous, plain-text answers ----------------

def _query_spec(request: web.Request) -> WorkerSpec:
    q = request.query
    return _spec(request, url=q.get("url"), worker_type=q.get("worker_type"),
                 bootstrap_port=q.get("bootstrap_port"),
                 extra={"zone": q["zone"]} if "zone" in q else None)


async def add_worker(request: web.Request) -> web.Response:
    spec = _query_spec(request)
    api = _api(request)
    api.id_of(spec.url)
    try:
        await api.run_and_wait(normalize(spec.url), api.registrar.add(spec))
    except AlreadyRegistered as e:
        return web.Response(status=400, text=f"Worker {normalize(spec.url)} already exists: {e}")
    except RegistrationError as e:
        return web.Response(status=400, text=str(e))
    return web.Response(text=f"Successfully added worker: {normalize(spec.url)}")


async def remove_worker(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        raise BadRequest("the 'url' query parameter is required")
    try:
        _removable(request, url)
        await _api(request).registrar.remove(url)
    except NotRegistered as e:
        return web.Response(status=400, text=str(e))
    return web.Response(text=f"Successfully removed worker: {normalize(url)}")


async def list_worker_urls(request: web.Request) -> web.Response:
    return web.json_response({"urls": [w.endpoint for w in _listed(request)]})


def worker_api_ctx(make_registrar):
    """Create the registrar once the router's session exists; cancel unfinished jobs at
    shutdown. ``make_registrar(app)`` builds it from the application's state."""

    async def ctx(app: web.Application):
        app[WORKER_API] = WorkerApi(registrar=make_registrar(app), clock=app[ROUTER].clock)
        for w in app[ROUTER].store.table.rollout_workers():
            if w.endpoint:
                app[WORKER_API].id_of(w.endpoint)
        yield
        await asyncio.gather(*app[WORKER_API].cancel_all(), return_exceptions=True)

    return ctx


def add_worker_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/workers", list_workers)
    r.add_post("/workers", create_worker)
    r.add_get("/workers/{worker_id}", get_worker)
    r.add_delete("/workers/{worker_id}", delete_worker)
    r.add_post("/add_worker", add_worker)
    r.add_post("/remove_worker", remove_worker)
    r.add_get("/list_workers", list_worker_urls)
