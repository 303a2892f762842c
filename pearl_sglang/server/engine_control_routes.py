"""SGLang's engine-control calls, answered at PEARL's address.

AReaL (and any client that treats its server address as one SGLang server) sends
``/pause_generation``, ``/continue_generation`` and ``/update_weights_from_disk`` to the same
address as ``/generate``. Fanning them out to the workers behind PEARL would be unsafe: a
paused worker holds requests PEARL keeps routing to it, and a weight update that bypasses
the control plane leaves PEARL's snapshot (what joining workers are synced to) stale. So
they become PEARL-level operations:

* ``/pause_generation`` (SGLang's default mode ``abort``): new requests are held at PEARL's
  admission gate, and every request in flight is aborted as a client abort would, returning
  its partial output (AReaL resubmits prompt + partial output after the pause). Other modes
  are refused with 400: PEARL does not keep requests parked inside workers.
* ``/continue_generation``: the gate opens; held requests proceed.
* ``/update_weights_from_disk``: the control plane's weight update (every worker, and the
  snapshot later joiners are synced to), after aborting the requests in flight when
  ``abort_all_requests`` asks for it, as SGLang does; 400 with ``success: false`` when no
  worker could load the checkpoint.
"""
from __future__ import annotations

import json
from contextlib import AsyncExitStack
from aiohttp import web

from pearl_sglang.core.weight_snapshot import WeightSnapshot
from pearl_sglang.router.drain import abort
from pearl_sglang.router.errors import BadRequest
from pearl_sglang.router.state import ROUTER, RouterState
from pearl_sglang.server.control_routes import _body, _control, _opt_str, _run

PATHS = ("/pause_generation", "/continue_generation", "/update_weights_from_disk")
PAUSE = web.AppKey("pearl_pause", dict)


async def _abort_in_flight(st: RouterState) -> int:
    entries = st.inflight.matching(None)
    await abort(st, entries)
    return len(entries)


async def pause_generation(request: web.Request) -> web.Response:
    body = await _body(request)
    mode = body.get("mode", "abort")
    if mode != "abort":
        raise BadRequest(f"mode {mode!r} is not supported behind PEARL; use 'abort' (the default)")
    st, pause = request.app[ROUTER], request.app[PAUSE]
    if pause.get("hold") is None:
        hold = AsyncExitStack()
        await hold.enter_async_context(st.gate.closed("generation paused by /pause_generation"))
        pause["hold"] = hold
    aborted = await _abort_in_flight(st)
    return web.json_response({"success": True, "message": f"paused; {aborted} requests aborted"})


async def continue_generation(request: web.Request) -> web.Response:
    await _body(request)
    hold = request.app[PAUSE].pop("hold", None)
    if hold is not None:
        await hold.aclose()
    return web.json_response({"success": True, "message": "generation continues"})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    orch = _control(request)
    body = await _body(request)
    path = _opt_str(body, "model_path")
    if path is None:
        raise BadRequest("'model_path' is required (a checkpoint folder the workers can read)")
    abort_all = body.get("abort_all_requests", False)
    if not isinstance(abort_all, bool):
        raise BadRequest("'abort_all_requests' must be a boolean")
    version = _opt_str(body, "weight_version") or path
    if abort_all:
        await _abort_in_flight(request.app[ROUTER])
    answer = json.loads((await _run(orch.update_weights(snapshot=WeightSnapshot(
        version=version, model_path=path, load_format=_opt_str(body, "load_format"))))).text)
    if not answer["applied"]:  # as SGLang answers a load that failed: 400, success false
        return web.json_response({"success": False, "num_paused_requests": 0, "pearl": answer,
                                  "message": f"no worker loaded {path!r}: {answer['workers']}"}, status=400)
    return web.json_response({"success": True, "message": "weights updated", "num_paused_requests": 0,
                              "pearl": answer})


def add_engine_control_routes(app: web.Application) -> None:
    app[PAUSE] = {}
    r = app.router
    r.add_post("/pause_generation", pause_generation)
    r.add_post("/continue_generation", continue_generation)
    r.add_post("/update_weights_from_disk", update_weights_from_disk)
