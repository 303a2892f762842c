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
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from pearl_sglang.aio import gather_settled
from pearl_sglang.router.client_watch import client_gone
from pearl_sglang.router.errors import RequestAborted, UpstreamFailed
from pearl_sglang.router.inflight import InFlight
from pearl_sglang.router.stall import silent_answer_bound_s
from pearl_sglang.router.state import RouterState
from pearl_sglang.workers.errors import WorkerError, WorkerStalled, WorkerUnavailable, status_error

log = logging.getLogger("pearl.router")
# What SGLang's own streaming answers carry.
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


@dataclass
class Answer:
    """The client's answer once the proxy began sending it (``abortable`` ends it)."""

    response: web.StreamResponse | None = None


def openai_rids(st: RouterState, body: dict[str, Any], sequences: int) -> tuple[list[str], bool]:
    """The rids the router knows the request by, and whether its worker knows it by them
    too. A single sequence without one gets a router rid (SGLang's OpenAI endpoints take
    ``rid``), so a drain or abort can name it. SGLang 0.5.23 renames the samples of
    ``n > 1`` and makes ``rid_i`` of a batch's one rid, so only a client's list of one rid
    per prompt names a batch's sequences at the worker; other requests are aborted by the
    router itself (``abortable``)."""
    rid = body.get("rid")
    if rid is None:
        rid = f"pearl-oai-{secrets.token_hex(8)}"
        if sequences == 1:
            body["rid"] = rid
    rids = [rid] if isinstance(rid, str) else list(rid)
    st.inflight.refuse_open(rids)
    known = sequences == 1 or ((body.get("n") or 1) == 1 and isinstance(rid, list))
    return rids, known


async def abortable(request: web.Request, entries: list[InFlight],
                    proxy: Callable[[Answer], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Run ``proxy`` for a request its worker does not know by rid; an abort of ``entries``
    stops it here: the router closes its connection to the worker (SGLang then aborts
    every sequence of it) and the client learns of it, by an error event and the end of a
    stream it was reading, or by a 499 (``RequestAborted``). No partial output comes back:
    the worker had sent none the router could cut."""
    answer = Answer()
    running = asyncio.ensure_future(proxy(answer))
    try:
        await asyncio.wait((running, *(e.aborted() for e in entries)), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not running.done():
            running.cancel()
            await gather_settled(running)
    if not running.cancelled():
        return running.result()
    resp = answer.response
    error = RequestAborted(f"{request.path} was aborted before it finished; a proxied request with several "
                           "sequences cannot return its partial output")
    if resp is None or not resp.prepared:
        raise error
    if resp.content_type == "text/event-stream":
        with contextlib.suppress(ConnectionError):
            await resp.write(b"data: " + json.dumps(error.body()).encode() + b"\n\ndata: [DONE]\n\n")
    resp.force_close()
    return resp


async def proxy_with_retries(request: web.Request, st: RouterState, key: tuple[int, ...], trajectory: str | None,
                             body: dict[str, Any], entries, answer: Answer | None = None) -> web.StreamResponse:
    failed: set[int] = set()
    last_error: Exception | None = None
    for _ in range(st.config.dispatch.max_attempts):
        await st.gate.admit()
        target = await st.dispatcher.route(key, trajectory=trajectory, exclude=failed, what=request.path)
        urls = tuple(w.endpoint for w in (target.worker, target.prefill, target.decode) if w)
        for entry in entries:
            st.inflight.assign(entry, target.slots, urls)
        try:
            return await _proxy_once(request, st, target, body, answer or Answer())
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


async def _proxy_once(request: web.Request, st: RouterState, target, body: dict[str, Any],
                      answer: Answer) -> web.StreamResponse:
    timeouts = st.config.timeouts
    main = target.decode if target.is_pd else target.worker
    prefill_task = None
    if target.is_pd:
        body = {**body, "bootstrap_host": urlparse(target.prefill.endpoint).hostname,
                "bootstrap_port": target.prefill.bootstrap_port, "bootstrap_room": secrets.randbits(63)}
        prefill_task = asyncio.ensure_future(_drain(st.session, target.prefill, request.path,
                                                    {**body, "stream": False}, timeouts))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=_silence_s(st, body))
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
            answer.response = resp
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


def _silence_s(st: RouterState, body: dict[str, Any]) -> float:
    """How long the worker may stay silent: a stream's stall bound between chunks, or the
    whole generation's for an answer sent whole (a worker silent for a stall bound is
    still generating it)."""
    if body.get("stream"):
        return st.config.timeouts.chunk_s
    budget = body.get("max_completion_tokens") or body.get("max_tokens")
    if type(budget) is not int:
        budget = st.config.limits.max_new_tokens  # a chat's default: the rest of its context
    return silent_answer_bound_s(st.config.timeouts.chunk_s, budget, st.config.dispatch.internal_stream_interval)


async def _drain(session, worker, path, body, timeouts) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.chunk_s)
    async with session.post(worker.endpoint + path, json=body, timeout=timeout) as resp:
        await resp.read()
