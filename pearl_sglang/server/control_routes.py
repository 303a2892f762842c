"""Admin API of the control plane (docs/admin-api.md): typed bodies in, JSON answers out."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pearl_sglang.control.idempotency import RequestIdReused
from pearl_sglang.control.orchestrator import Orchestrator
from pearl_sglang.core.errors import OutOfOrder
from pearl_sglang.control.weight_group import (GroupExists, GroupInitFailed, GroupSpec, InvalidGroupRequest,
                                               MembershipChanged, TensorSpecs, UnknownGroup)
from pearl_sglang.control.weight_pushes import NoActiveWorker
from pearl_sglang.core.weight_snapshot import WeightSnapshot
from pearl_sglang.core.errors import CoreError, InvalidConfig
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.state import is_gpu_id
from pearl_sglang.router.errors import BadRequest, Conflict, NotFound, RouterError, ServiceUnavailable, UpstreamFailed
from pearl_sglang.router.middleware import read_json
from pearl_sglang.router.state import ROUTER


@dataclass
class ControlPlane:
    """The running control plane: set once the application's session exists, absent in
    attach mode (the router then serves without one)."""

    orchestrator: Orchestrator | None = None


CONTROL = web.AppKey("pearl_control", ControlPlane)
MAX_GPUS_PER_CALL = 4096


class GatewayTimeout(RouterError):
    status = 504
    kind = "deadline_exceeded"


def _control(request: web.Request) -> Orchestrator:
    orch = request.app[CONTROL].orchestrator
    if orch is None:
        raise Conflict("this router runs in attach mode without a control plane; start it with "
                       "--config cluster.yaml to use the admin API", kind="no_control_plane")
    return orch


async def _body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer")
    return value


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
        raise BadRequest(f"'{key}' must be a non-empty string of at most 256 characters")
    return value


def _positive(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 86400:
        raise BadRequest(f"'{key}' must be a number of seconds in (0, 86400)")
    return float(value)


def _gpus(body: dict[str, Any]) -> tuple[str, ...]:
    gpus = body.get("gpus")
    if not isinstance(gpus, list) or not 0 < len(gpus) <= MAX_GPUS_PER_CALL or not all(map(is_gpu_id, gpus)):
        raise BadRequest(f"'gpus' must be a list of 1..{MAX_GPUS_PER_CALL} GPU ids like 'node3:0' "
                         "(an ASCII node name, a colon, the GPU's index)")
    return tuple(gpus)


def _check_hosts(request: web.Request, body: dict[str, Any]) -> None:
    """``hosts`` maps GPU nodes to addresses; each must match --allowed-worker-hosts."""
    hosts = body.get("hosts")
    if hosts is None:
        return
    if not isinstance(hosts, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                              for k, v in hosts.items()):
        raise BadRequest("'hosts' must map node names to host names or addresses")
    security = request.app[ROUTER].config.security
    refused = sorted(v for v in hosts.values() if not security.worker_host_allowed(v))
    if refused:
        raise BadRequest(f"worker hosts {refused} are not in --allowed-worker-hosts",
                         kind="worker_host_not_allowed")


# What each control-plane error is to an HTTP client: the first row whose error class
# matches gives the answer's class and its ``kind`` (None: the answer class's own).
ANSWERS: tuple[tuple[type[Exception], type[RouterError], str | None], ...] = (
    (OutOfOrder, Conflict, "out_of_order"),
    (RequestIdReused, Conflict, "request_id_reused"),
    (NoActiveWorker, ServiceUnavailable, "no_active_worker"),
    (CoreError, Conflict, "invalid_transition"),
    (InvalidGroupRequest, BadRequest, None),
    (UnknownGroup, NotFound, "unknown_weight_group"),
    (MembershipChanged, Conflict, "weight_group_membership"),
    (GroupExists, Conflict, "weight_group_exists"),
    (GroupInitFailed, UpstreamFailed, "weight_group_init_failed"),
)


def answer_for(error: Exception) -> RouterError | None:
    for error_class, answer_class, kind in ANSWERS:
        if isinstance(error, error_class):
            return answer_class(str(error), kind=kind)
    return None


async def _run(coro, *, deadline_s: float | None = None) -> web.Response:
    try:
        if deadline_s is None:
            return web.json_response(await coro)
        return web.json_response(await asyncio.wait_for(coro, deadline_s))
    except Exception as e:
        answer = answer_for(e)
        if answer is not None:
            raise answer from e
        if isinstance(e, asyncio.TimeoutError):
            raise GatewayTimeout(f"the operation did not finish within {deadline_s:g}s; it goes on (see "
                                 f"/pearl/state), and a retry with the same request_id waits for it") from e
        raise
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # this request itself was cancelled: the client left or the router stops
        # A concurrent admin call cancelled the work this call was waiting for.
        raise Conflict("pre-empted by a concurrent admin call (train_begin or a GPU leave cancels "
                       "optional changes in flight); see /pearl/state and call again if still needed",
                       kind="preempted") from e


async def train_begin(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    step, rid = _int(body, "step"), _opt_str(body, "request_id")
    deadline = _positive(body, "deadline_s", orch.config.deadlines.train_begin_s * 2)
    return await _run(orch.train_begin(step=step, request_id=rid), deadline_s=deadline)


async def train_finished(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    remaining = body.get("remaining_trajectories")
    if remaining is not None and (isinstance(remaining, bool) or not isinstance(remaining, (int, float))
                                  or remaining < 0):
        raise BadRequest("'remaining_trajectories' must be a non-negative number")
    return await _run(orch.train_finished(step=_int(body, "step"), remaining=remaining,
                                          request_id=_opt_str(body, "request_id")))


async def update_weights(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    version = _opt_str(body, "version")
    if version is None:
        raise BadRequest("'version' is required")
    path, fmt, rid = _opt_str(body, "model_path"), _opt_str(body, "load_format"), _opt_str(body, "request_id")
    if "distributed" in body:
        group, tensors = _distributed(body["distributed"])
        snapshot = WeightSnapshot(version=version, model_path=path, load_format=fmt, group=group)
        return await _run(orch.update_weights(snapshot=snapshot, tensors=tensors, request_id=rid))
    if path is None:
        raise BadRequest("'model_path' is required (a checkpoint folder the workers can read), or "
                         "'distributed' for a broadcast over a weight group")
    snapshot = WeightSnapshot(version=version, model_path=path, load_format=fmt)
    return await _run(orch.update_weights(snapshot=snapshot, request_id=rid))


MAX_TENSORS = 1 << 16


def _distributed(spec: Any) -> tuple[str, TensorSpecs]:
    """``{"group_name", "names", "dtypes", "shapes"}`` as typed specs (lengths are checked
    by ``TensorSpecs.validate``)."""
    if not isinstance(spec, dict):
        raise BadRequest("'distributed' must be an object {group_name, names, dtypes, shapes}")
    group = _opt_str(spec, "group_name")
    if group is None:
        raise BadRequest("'distributed.group_name' is required")
    lists = {k: spec.get(k) for k in ("names", "dtypes", "shapes")}
    for key, value in lists.items():
        if not isinstance(value, list) or len(value) > MAX_TENSORS:
            raise BadRequest(f"'distributed.{key}' must be a list of at most {MAX_TENSORS} items")
    if not all(isinstance(n, str) and n for n in lists["names"] + lists["dtypes"]):
        raise BadRequest("'distributed.names' and 'distributed.dtypes' must hold non-empty strings")
    shapes = lists["shapes"]
    if not all(isinstance(sh, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in sh)
               for sh in shapes):
        raise BadRequest("'distributed.shapes' must be a list of integer lists, one per tensor")
    return group, TensorSpecs(names=tuple(lists["names"]), dtypes=tuple(lists["dtypes"]),
                              shapes=tuple(tuple(sh) for sh in shapes))


async def weight_group(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    action, name, rid = body.get("action"), _opt_str(body, "group_name"), _opt_str(body, "request_id")
    if name is None:
        raise BadRequest("'group_name' is required")
    if action == "destroy":
        return await _run(orch.weight_group(destroy=name, request_id=rid))
    if action != "init":
        raise BadRequest("'action' must be 'init' or 'destroy'")
    address, backend = _opt_str(body, "master_address"), body.get("backend", "nccl")
    if address is None:
        raise BadRequest("'master_address' is required (where the trainer, rank 0, listens)")
    spec = GroupSpec(group_name=name, master_address=address, master_port=_int(body, "master_port"),
                     backend=backend if isinstance(backend, str) else "")
    return await _run(orch.weight_group(spec=spec, request_id=rid))


async def gpus(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    action, rid = body.get("action"), _opt_str(body, "request_id")
    if action == "join":
        _check_hosts(request, body)
        return await _run(orch.gpus_join(gpus=_gpus(body), request_id=rid))
    if action == "leave":
        deadline = _positive(body, "deadline_s", orch.config.deadlines.leave_s)
        # The control plane stops stragglers at 80% of the deadline; the rest is margin.
        return await _run(orch.gpus_leave(gpus=_gpus(body), deadline_s=deadline, request_id=rid),
                          deadline_s=deadline + 10.0)
    raise BadRequest("'action' must be 'join' or 'leave'")


async def pd_mode(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    try:
        mode = PdMode(body.get("pd_mode"))
    except InvalidConfig as e:
        raise BadRequest("'pd_mode' must be 'auto', 'colocated', 'disaggregated' or a fixed ratio 'P:D' "
                         "(positive integers, e.g. '3:5')") from e
    answer = await _run(orch.set_pd_mode(mode))
    reason = json.loads(answer.text).get("reason")
    if reason:
        topology = orch.store.table.active_topology().label()
        raise ServiceUnavailable(f"pd_mode={mode} is set but its topology was not reached ({reason}); the "
                                 f"cluster serves {topology} and re-plans with back-off", kind="target_not_reached")
    return answer


def add_control_routes(app: web.Application) -> None:
    app[CONTROL] = ControlPlane()
    r = app.router
    r.add_post("/train_begin", train_begin)
    r.add_post("/train_finished", train_finished)
    r.add_post("/update_weights", update_weights)
    r.add_post("/pearl/gpus", gpus)
    r.add_post("/pearl/pd_mode", pd_mode)
    r.add_post("/pearl/weight_group", weight_group)
