"""OpenAI requests the router cannot run as token ids (tools, logprobs, batched prompts, ...),
proxied to the chosen worker (or PD pair) as they are.

They are in the in-flight registry (load, drain, abort by rid) under the rids the worker
will know them by, and retried on another worker only before the first byte reached the
client; a worker that breaks after that ends the client's stream with an error event.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from typing import Any
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from pearl_sglang.router.client_watch import client_gone
from pearl_sglang.router.errors import UpstreamFailed
from pearl_sglang.router.state import RouterState
from pearl_sglang.workers.errors import WorkerError, WorkerStalled, WorkerUnavailable, status_error

log = logging.getLogger("pearl.router")
# What SGLang's own streaming answers carry.
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


def openai_rids(st: RouterState, body: dict[str, Any], sequences: int) -> list[str]:
    """The rids the worker will know the request by. A single sequence without one gets a
    router rid (SGLang's OpenAI endpoints take ``rid``), so a drain or abort can name it."""
    rid = body.get("rid")
    if rid is None:
        rid = f"pearl-oai-{secrets.token_hex(8)}"
        if sequences == 1:
            body["rid"] = rid
    rids = [rid] if isinstance(rid, str) else list(rid)
    st.inflight.refuse_open(rids)
    return rids


async def proxy_with_retries(request: web.Request, st: RouterState, key: tuple[int, ...],
                              trajectory: str | None, body: dict[str, Any], entries) -> web.StreamResponse:
    failed: set[int] = set()
    last_error: Exception | None = None
    for _ in range(st.config.dispatch.max_attempts):
        await st.gate.admit()
        target = await st.dispatcher.route(key, trajectory=trajectory, exclude=failed, what=request.path)
        urls = tuple(w.endpoint for w in (target.worker, target.prefill, target.decode) if w)
        for entry in entries:
            st.inflight.assign(entry, target.slots, urls)
        try:
            return await _proxy_once(request, st, target, body)
        except WorkerError as e:
            if not e.retryable:
                raise  # a worker's 4xx goes back as it came (router.answers)
            failed.add(int(e.worker_id))
            if isinstance(e, WorkerStalled):
                st.breakers.trip(int(e.worker_id))
            elif isinstance(e, WorkerUnavailable):
                st.breakers.failure(int(e.worker_id))
            last_error = e
    raise UpstreamFailed(f"no worker answered {request.path}: {last_error}")


async def _proxy_once(request: web.Request, st: RouterState, target, body: dict[str, Any]) -> web.StreamResponse:
    timeouts = st.config.timeouts
    main = target.decode if target.is_pd else target.worker
    prefill_task = None
    if target.is_pd:
        body = {**body, "bootstrap_host": urlparse(target.prefill.endpoint).hostname,
                "bootstrap_port": target.prefill.bootstrap_port, "bootstrap_room": secrets.randbits(63)}
        prefill_task = asyncio.ensure_future(_drain(st.session, target.prefill, request.path,
                                                    {**body, "stream": False}, timeouts))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.chunk_s)
    resp: web.StreamResponse | None = None
    try:
        async with st.session.post(main.endpoint + request.path, json=body, timeout=timeout) as up:
            if up.status >= 400:
                raise status_error(str(main.slot), up.status, await up.read(),
                                   up.headers.get("Content-Type", "application/json"))
            ctype = up.headers.get("Content-Type", "application/json")
            if ctype.startswith("text/event-stream"):
                ctype = SSE_CONTENT_TYPE
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
        await resp.write_eof()
        return resp
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
        stalled = isinstance(e, asyncio.TimeoutError)
        if resp is None:
            raise (WorkerStalled if stalled else WorkerUnavailable)(str(main.slot), repr(e)) from e
        if client_gone(request):
            log.info("client %s left %s", request.remote, request.path)
            return resp
        # The worker broke after bytes reached the client: nothing can be retried here, but
        # the client must learn of it (an error event, or a connection closed mid-body).
        st.breakers.trip(main.slot) if stalled else st.breakers.failure(main.slot)
        if resp.content_type == "text/event-stream":
            with contextlib.suppress(ConnectionError):
                error = UpstreamFailed(f"worker {main.slot} failed mid-stream: {e!r}").body()
                await resp.write(b"data: " + json.dumps(error).encode() + b"\n\n")
        resp.force_close()
        return resp
    finally:
        if prefill_task is not None and not prefill_task.done():
            prefill_task.cancel()


async def _drain(session, worker, path, body, timeouts) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.chunk_s)
    async with session.post(worker.endpoint + path, json=body, timeout=timeout) as resp:
        await resp.read()
