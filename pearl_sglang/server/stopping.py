"""Stopping the router (SIGTERM, SIGINT) without losing what it accepted.

The listening socket closes at once and each keep-alive connection closes after its
answer, so no new request arrives. Requests in flight get ``grace_s`` to finish; those
still running then are aborted as a client's abort would be: each answers with its output
so far and finish reason ``abort``, and a trainer resubmits prompt + partial output as it
does after ``/pause_generation``. While generation is paused by ``/pause_generation`` there
is no grace: the requests it holds cannot run before the router is gone (no
``/continue_generation`` can arrive any more), so they answer ``abort`` at once. Worker
registrations still waiting for their worker are cancelled at once (a legacy
``/add_worker`` answers 503). Only then does aiohttp close
what is left, within the runner's ``close_s``. A proxied OpenAI request its worker knows
by other rids (``n > 1``, a batch under one rid) has no output to keep: the router stops
it and answers 499 ``request_aborted`` (``passthrough.abortable``).
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from pearl_sglang.router.drain import abort
from pearl_sglang.router.state import ROUTER
from pearl_sglang.server.engine_control_routes import PAUSE
from pearl_sglang.server.worker_api import WORKER_API

log = logging.getLogger("pearl.router")

POLL_S = 0.05


async def stop_serving(runner: web.AppRunner, grace_s: float) -> None:
    app = runner.app
    st = app[ROUTER]
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()
    if st.connections is not None and st.connections.lane is not None:
        st.connections.lane.stop_taking()  # its keep-alive connections too close after their answer
    if WORKER_API in app:  # a worker added now would serve nobody
        app[WORKER_API].cancel_all()
    loop = asyncio.get_running_loop()
    paused = PAUSE in app and app[PAUSE].get("hold") is not None
    deadline = loop.time() + (0.0 if paused else grace_s)
    while len(st.inflight) and loop.time() < deadline:
        await asyncio.sleep(POLL_S)
    left = st.inflight.matching(None)
    if left:
        log.warning("stopping: %d requests still running after %.0f s%s; aborting them "
                    "(each answers with its output so far)", len(left), 0.0 if paused else grace_s,
                    " (generation paused)" if paused else "")
        await abort(st, left)
    await runner.cleanup()
