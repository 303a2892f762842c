"""Control and introspection endpoints of SGLang 0.5.23, over the engine's control API.

Lifecycle calls (weights, memory, role switch) wait for the engine's ``on_done``, which
arrives after the profile's duration in emulated time.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from aiohttp import web

from . import __version__ as EMU_VERSION
from .control import PAUSE_MODES
from .metrics import render_metrics
from .request import OpResult
from .worker import WORKER, Worker

SGLANG_VERSION = "0.5.23"


async def _body(request: web.Request) -> dict:
    if not request.can_read_body:
        return {}
    try:
        data = await request.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _waiter() -> tuple["asyncio.Future[OpResult]", Any]:
    fut: asyncio.Future = asyncio.get_running_loop().create_future()

    def done(result: OpResult) -> None:
        if not fut.done():
            fut.set_result(result)
    return fut, done


def _result_json(r: OpResult, **extra: Any) -> web.Response:
    return web.json_response({"success": r.success, "message": r.message, **r.as_dict(), **extra},
                             status=200 if r.success else 400)


# ---- health & info ------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    w = request.app[WORKER]
    e = w.engine
    if e.released_tags:
        return web.Response(status=503)
    if e.paused is not None:
        deadline = w.clock.now() + w.args.health_timeout
        while e.paused is not None and w.clock.now() < deadline:
            await asyncio.sleep(w.clock.real_delay(min(0.05 * w.clock.scale, deadline - w.clock.now())))
        if e.paused is not None:
            return web.Response(status=503)
    return web.Response(status=200)


def model_info_dict(w: Worker) -> dict:
    return {
        "model_path": w.engine.model_path, "served_model_name": w.served_model_name,
        "tokenizer_path": w.args.tokenizer_path or w.args.model_path, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": w.engine.version,
        "load_format": w.args.load_format, "reasoning_parser": None, "tool_call_parser": None,
        "disaggregation_mode": w.engine.role.value, "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": w.meta.model_type,
        "architectures": list(w.meta.architectures) or None,
    }


async def model_info(request: web.Request) -> web.Response:
    return web.json_response(model_info_dict(request.app[WORKER]))


async def server_info(request: web.Request) -> web.Response:
    w = request.app[WORKER]
    a, e = w.args, w.engine
    info = {k: v for k, v in vars(a).items()}
    info.update({
        "served_model_name": w.served_model_name,
        "max_total_num_tokens": e.sched.capacity,
        "max_req_input_len": min(e.context_length, e.sched.capacity) - 1,
        "chunked_prefill_size": e.sched.chunk_budget,
        "max_running_requests": e.sched.max_running,
        "context_length": e.context_length,
        "internal_states": [{"last_gen_throughput": e.loads().gen_throughput,
                             "memory_usage": {"kv_cache_tokens": e.sched.capacity}}],
        "version": SGLANG_VERSION, "startup_time": w.started_wall,
        "launch_command": "python -m pearl_sglang.emulator", "frontend": "python",
        "emulator": {"version": EMU_VERSION, "profile": w.profile.name, "time_scale": a.time_scale},
    })
    return web.json_response(info)


async def models(request: web.Request) -> web.Response:
    w = request.app[WORKER]
    return web.json_response({"object": "list", "data": [{
        "id": w.served_model_name, "object": "model", "created": int(w.started_wall),
        "owned_by": "sglang", "root": w.served_model_name, "max_model_len": w.engine.context_length}]})


LOAD_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}


async def loads(request: web.Request) -> web.Response:
    w = request.app[WORKER]
    include = set(filter(None, request.query.get("include", "all").split(",")))
    if not include <= LOAD_SECTIONS:
        return web.json_response({"error": f"Invalid include sections: {sorted(include - LOAD_SECTIONS)}"},
                                 status=400)
    s = w.engine.loads()
    load: dict[str, Any] = {
        "dp_rank": 0, "num_running_reqs": s.num_running_reqs, "num_waiting_reqs": s.num_waiting_reqs,
        "num_used_tokens": s.num_used_tokens, "num_total_tokens": s.num_total_tokens,
        "max_total_num_tokens": s.num_total_tokens, "max_running_requests": s.max_running_requests,
        "token_usage": s.token_usage, "gen_throughput": s.gen_throughput,
        "cache_hit_rate": s.cache_hit_rate, "utilization": s.utilization}
    every = "all" in include
    if every or "memory" in include:
        kv_gb = s.num_total_tokens * w.profile.kv_bytes_per_token / 1e9
        load["memory"] = {"weight_gb": 0.0 if "weights" in w.engine.released_tags else None,
                          "kv_cache_gb": kv_gb, "graph_gb": 0.0, "token_capacity": s.num_total_tokens}
    if every or "disagg" in include:
        load["disaggregation"] = {
            "mode": s.mode, "prefill_bootstrap_queue_reqs": s.prefill_bootstrap_queue_reqs,
            "prefill_inflight_queue_reqs": s.prefill_inflight_queue_reqs,
            "decode_prealloc_queue_reqs": s.decode_prealloc_queue_reqs,
            "decode_transfer_queue_reqs": s.decode_transfer_queue_reqs,
            "decode_retracted_queue_reqs": 0, "kv_transfer_speed_gb_s": s.kv_transfer_speed_gb_s,
            "kv_transfer_latency_ms": w.profile.kv_latency_s * 1e3}
    if every or "queues" in include:
        load["queues"] = {"waiting": s.num_waiting_reqs, "grammar": 0, "paused": s.paused_reqs,
                          "retracted": s.retracted_reqs}
    if request.query.get("format") == "prometheus":
        lines = [f'sglang:{k}{{dp_rank="0"}} {float(v)}' for k, v in load.items()
                 if isinstance(v, (int, float)) and k != "dp_rank"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
    return web.json_response({"timestamp": time.time(), "version": SGLANG_VERSION,
                              "accelerator": "emulated", "num_accelerators": w.args.tp_size,
                              "loads": [load]})


async def metrics(request: web.Request) -> web.Response:
    w = request.app[WORKER]
    return web.Response(body=render_metrics(w), content_type="text/plain",
                        headers={"X-Content-Type": "text/plain; version=0.0.4"})


# ---- scheduling control --------------------------------------------------------------------
async def flush_cache(request: web.Request) -> web.Response:
    if request.app[WORKER].engine.flush_cache():
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation "
                                 "will not be performed.)\n")
    return web.Response(status=400, text="Cache not flushed: the server is not idle. Please "
                                         "check backend logs for more details. (When there are "
                                         "running or waiting requests, the operation will not "
                                         "be performed.)\n")


async def abort_request(request: web.Request) -> web.Response:
    body = await _body(request)
    e = request.app[WORKER].engine
    if body.get("abort_all"):
        e.abort(abort_all=True)
    elif body.get("rid"):
        e.abort(str(body["rid"]))
    return web.Response(status=200)


async def pause_generation(request: web.Request) -> web.Response:
    mode = (await _body(request)).get("mode") or "abort"
    if mode not in PAUSE_MODES:
        return web.json_response({"error": {"message": f"invalid pause mode {mode!r}"}}, status=400)
    request.app[WORKER].engine.pause(mode)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    request.app[WORKER].engine.continue_generation()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def _memory(request: web.Request, *, release: bool) -> web.Response:
    e = request.app[WORKER].engine
    tags = (await _body(request)).get("tags")
    fut, done = _waiter()
    (e.release_memory if release else e.resume_memory)(tags, on_done=done)
    r = await fut
    if not r.success:
        return web.json_response({"error": {"message": r.message}}, status=400)
    return web.json_response(None)


async def release_memory(request: web.Request) -> web.Response:
    return await _memory(request, release=True)


async def resume_memory(request: web.Request) -> web.Response:
    return await _memory(request, release=False)


async def pd_role_switch(request: web.Request) -> web.Response:
    body = await _body(request)
    fut, done = _waiter()
    request.app[WORKER].engine.switch_role(
        str(body.get("new_role")), decode_cuda_graph_memory_gb=body.get("decode_cuda_graph_memory_gb"),
        on_done=done)
    return _result_json(await fut)


# ---- weights ------------------------------------------------------------------------------
async def _update(w: Worker, source: str, body: dict, *, model_path: Optional[str] = None) -> OpResult:
    fut, done = _waiter()
    w.engine.update_weights(source, weight_version=body.get("weight_version"), model_path=model_path,
                            abort_all_requests=bool(body.get("abort_all_requests")),
                            flush_cache=body.get("flush_cache", True) is not False, on_done=done)
    return await fut


async def update_weights_from_disk(request: web.Request) -> web.Response:
    import os
    w = request.app[WORKER]
    body = await _body(request)
    path = body.get("model_path")
    fmt = body.get("load_format") or w.args.load_format
    if fmt == "dummy":
        r = OpResult(False, "Failed to get model loader: DummyModelLoader")
    elif not isinstance(path, str) or not os.path.isdir(path):
        r = OpResult(False, f"Failed to update weights: model path {path!r} does not exist")
    else:
        r = await _update(w, "disk", body, model_path=path)
    return web.json_response({"success": r.success, "message": r.message,
                              "num_paused_requests": dict(r.extra).get("num_paused_requests", 0)},
                             status=200 if r.success else 400)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


async def init_weights_update_group(request: web.Request) -> web.Response:
    """Rendezvous is not emulated (it answers at once), but the rank layout is checked:
    the trainer is rank 0, so a worker's ranks start at ``rank_offset >= 1``."""
    w = request.app[WORKER]
    body = await _body(request)
    world, offset, port = body.get("world_size"), body.get("rank_offset"), body.get("master_port")
    if not (_is_int(world) and _is_int(offset) and _is_int(port) and 1 <= offset < world):
        return _result_json(OpResult(False, "init_weights_update_group needs integers master_port, world_size "
                                            "and rank_offset with 1 <= rank_offset < world_size"))
    w.weight_group = body.get("group_name") or "weight_update_group"
    return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})


async def destroy_weights_update_group(request: web.Request) -> web.Response:
    request.app[WORKER].weight_group = None
    return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})


async def begin_weight_update(request: web.Request) -> web.Response:
    request.app[WORKER].in_weight_update = True
    return web.json_response({"success": True, "message": "Weight update begun."})


async def end_weight_update(request: web.Request) -> web.Response:
    request.app[WORKER].in_weight_update = False
    return web.json_response({"success": True, "message": "Weight update ended."})


async def update_weights_from_distributed(request: web.Request) -> web.Response:
    w = request.app[WORKER]
    body = await _body(request)
    group = body.get("group_name") or "weight_update_group"
    if w.weight_group is None or group != w.weight_group:
        return _result_json(OpResult(False, f"weight update group {group!r} is not initialized"))
    if not w.in_weight_update:
        return _result_json(OpResult(False, "update_weights_from_distributed must be called between "
                                            "/begin_weight_update and /end_weight_update"))
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not (isinstance(names, list) and names and isinstance(dtypes, list) and isinstance(shapes, list)
            and len(names) == len(dtypes) == len(shapes)):
        return _result_json(OpResult(False, "names, dtypes and shapes must be non-empty lists of one length"))
    return _result_json(await _update(w, "distributed", body))


async def update_weights_from_tensor(request: web.Request) -> web.Response:
    return _result_json(await _update(request.app[WORKER], "tensor", await _body(request)))


async def update_weight_version(request: web.Request) -> web.Response:
    body = await _body(request)
    new = body.get("new_version")
    if not isinstance(new, str):
        return web.json_response({"success": False, "message": "new_version is required"}, status=400)
    r = request.app[WORKER].engine.update_weight_version(
        new, abort_all_requests=body.get("abort_all_requests", True) is not False)
    return web.json_response({"success": True, "message": r.message, "new_version": new})


def add_routes(app: web.Application) -> None:
    r = app.router
    for path in ("/health", "/health_generate", "/ready"):
        r.add_get(path, health)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, server_info)
    r.add_get("/v1/models", models)
    r.add_get("/v1/loads", loads)
    r.add_get("/metrics", metrics)
    for method in (r.add_get, r.add_post):
        method("/flush_cache", flush_cache)
        method("/release_memory_occupation", release_memory)
        method("/resume_memory_occupation", resume_memory)
    posts = {
        "/abort_request": abort_request, "/pause_generation": pause_generation,
        "/continue_generation": continue_generation, "/pd_role_switch": pd_role_switch,
        "/update_weights_from_disk": update_weights_from_disk,
        "/init_weights_update_group": init_weights_update_group,
        "/destroy_weights_update_group": destroy_weights_update_group,
        "/begin_weight_update": begin_weight_update, "/end_weight_update": end_weight_update,
        "/update_weights_from_distributed": update_weights_from_distributed,
        "/update_weights_from_tensor": update_weights_from_tensor,
        "/update_weight_version": update_weight_version,
    }
    for path, fn in posts.items():
        r.add_post(path, fn)
