"""Inference endpoints: SGLang's ``/generate`` and the OpenAI-compatible API.

``/generate`` items run through the dispatcher (partial-trajectory retention, PD pairs,
affinity). Single-prompt text OpenAI requests do too, as token ids a worker rendered
and tokenized (``openai_generate``), each of their ``n`` choices an item. The rest
(tools, logprobs, batched prompts, ...) are proxied to the chosen worker (or PD pair) as
they are (``passthrough``).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, NamedTuple, Protocol, TypeVar

from aiohttp import web

from pearl_sglang import fastjson
from pearl_sglang.aio import gather_settled
from pearl_sglang.router import openai_dispatch, openai_generate
from pearl_sglang.router.answers import answer_for
from pearl_sglang.router.drain import abort
from pearl_sglang.router.errors import BadRequest, RouterError, TooManyStreams
from pearl_sglang.router.generate_request import GenerateCall, GenerateItem, parse_generate
from pearl_sglang.router.middleware import read_generate_json, read_json
from pearl_sglang.router.openai_request import parse_openai
from pearl_sglang.router.passthrough import SSE_CONTENT_TYPE, Answer, abortable, openai_rids, proxy_with_retries
from pearl_sglang.router.selection import prefix_key
from pearl_sglang.router.state import ROUTER, RouterState
from pearl_sglang.workers.errors import WorkerError

TRAJECTORY_HEADER = "X-Pearl-Trajectory-Id"
TURN_HEADER = "X-Pearl-Turn"
EXPECTED_TURNS_HEADER = "X-Pearl-Expected-Turns"
log = logging.getLogger("pearl.router")
Sink = TypeVar("Sink", bound="EventSink")


class StreamSlot:
    """Counts concurrent streams per client address (``limit_max_streams_per_client``)."""

    def __init__(self, st: RouterState, client: str | None) -> None:
        self.st = st
        self.client = client or "unknown"

    def __enter__(self) -> None:
        counts = self.st.streams_by_client
        if counts.get(self.client, 0) >= self.st.config.limits.max_streams_per_client:
            raise TooManyStreams(
                f"client has {counts[self.client]} streams open; max_streams_per_client="
                f"{self.st.config.limits.max_streams_per_client}")
        counts[self.client] = counts.get(self.client, 0) + 1

    def __exit__(self, *exc: object) -> None:
        counts = self.st.streams_by_client
        counts[self.client] -= 1
        if not counts[self.client]:
            del counts[self.client]


async def generate(request: web.Request) -> web.StreamResponse:
    st = request.app[ROUTER]
    started = st.clock.now()
    body, ids_checked = await read_generate_json(request)
    call = parse_generate(body, st.config.limits, ids_checked)
    runs = start_runs(st, call, trajectory_headers(request.headers, batch=call.is_batch))
    try:
        if call.stream:
            with StreamSlot(st, request.remote):
                return await _stream(request, runs, call.is_batch)
        with st.client_watch.watching(request):
            answer = await unstreamed_answer(runs, call.is_batch)
        return web.Response(body=fastjson.dumps(answer), content_type="application/json")
    finally:
        st.metrics.latency.labels("generate").observe(st.clock.now() - started)


def start_runs(st: RouterState, call: GenerateCall, tag: TrajectoryTag) -> list[AsyncIterator[dict[str, Any]]]:
    """The dispatcher's run of each item of a parsed call; a rid already in flight is a 400."""
    st.inflight.refuse_open(i.rid for i in call.items)
    trajectory, turn = tag.trajectory, tag.turn
    note_expected_turns(st, tag)
    items = call.items
    if st.config.straggler_priority and trajectory is not None:
        items = tuple(_with_straggler_priority(st, item, trajectory) for item in items)
    # A streaming client sees SGLang's default of a chunk per token unless it asks otherwise.
    interval = call.items[0].sampling.get("stream_interval", 1) if call.stream else None
    return [st.dispatcher.run(item, trajectory=trajectory, turn=turn, client_stream_interval=interval)
            for item in items]


async def unstreamed_answer(runs: list[AsyncIterator[dict[str, Any]]], is_batch: bool) -> Any:
    """The answer a client that does not stream gets: the item's last chunk, or a list.
    When one item fails the answer is its error, and the others stop at their workers."""
    if len(runs) > 1:
        tasks = [asyncio.ensure_future(_last(r)) for r in runs]
        try:
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await gather_settled(*tasks)
    last = await _last(runs[0])  # one item (a rollout turn) runs in this task: none of its own
    return [last] if is_batch else last


_TURN = re.compile(r"[0-9]{1,9}")
def _with_straggler_priority(st: RouterState, item: GenerateItem, trajectory: str) -> GenerateItem:
    """The critical path first: a predicted straggler's turn gets priority 1, others 0 (a
    client's own ``priority`` is kept)."""
    if "priority" in item.extra:
        return item
    now = asyncio.get_running_loop().time()
    late = st.telemetry.is_straggler(trajectory, now, share=st.config.straggler_share)
    return replace(item, extra={**item.extra, "priority": 1 if late else 0})


class TrajectoryTag(NamedTuple):
    """What a request's headers say about the trajectory it belongs to."""

    trajectory: str | None = None
    turn: int | None = None
    expected_turns: int | None = None  # the client's hint of the trajectory's total turns


def trajectory_headers(headers: Mapping[str, str], *, batch: bool) -> TrajectoryTag:
    """Strict: a turn is 1-9 ASCII digits, an expected turn count 1-9 digits and positive
    (and only with a trajectory id), a trajectory id at most 256 printable ASCII characters
    (anything else is a 400 naming the header)."""
    trajectory = headers.get(TRAJECTORY_HEADER) or None
    raw_turn = headers.get(TURN_HEADER)
    raw_expected = headers.get(EXPECTED_TURNS_HEADER)
    if raw_turn is not None and not _TURN.fullmatch(raw_turn):
        raise BadRequest(f"{TURN_HEADER} must be a non-negative integer of at most 9 ASCII digits, "
                         f"got {raw_turn[:40]!r}", kind="invalid_header")
    if raw_expected is not None and (not _TURN.fullmatch(raw_expected) or int(raw_expected) < 1):
        raise BadRequest(f"{EXPECTED_TURNS_HEADER} must be a positive integer of at most 9 ASCII digits, "
                         f"got {raw_expected[:40]!r}", kind="invalid_header")
    if trajectory is not None and (len(trajectory) > 256 or not (trajectory.isascii() and trajectory.isprintable())):
        raise BadRequest(f"{TRAJECTORY_HEADER} must be at most 256 printable ASCII characters",
                         kind="invalid_header")
    if raw_expected is not None and trajectory is None:
        raise BadRequest(f"{EXPECTED_TURNS_HEADER} needs {TRAJECTORY_HEADER}: the count is a trajectory's",
                         kind="invalid_header")
    if batch and trajectory is not None:
        raise BadRequest(f"{TRAJECTORY_HEADER} names one trajectory; send its turns one by one")
    return TrajectoryTag(trajectory, int(raw_turn) if raw_turn is not None else None,
                         int(raw_expected) if raw_expected is not None else None)


def note_expected_turns(st: RouterState, tag: TrajectoryTag) -> None:
    """The client's expected turn count, for the critical path (``core.critical_path``; on
    the event loop's clock, as the dispatcher's turn times)."""
    if tag.trajectory is not None and tag.expected_turns is not None:
        st.telemetry.expect_turns(tag.trajectory, tag.expected_turns, asyncio.get_running_loop().time())


async def _last(run: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    last = None
    async with contextlib.aclosing(run):  # cancelled (the client left): abort at the worker now
        async for chunk in run:
            last = chunk
    return last


class EventSink(Protocol):
    """Where a stream's events go once its head is sent (an aiohttp response, or the
    ``/generate`` lane's connection); ``write`` waits while the client's buffer is full."""

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self, data: bytes = b"") -> None: ...


async def _stream(request: web.Request, runs: list[AsyncIterator[dict[str, Any]]],
                  is_batch: bool, render: Callable[[int, dict[str, Any]], bytes] | None = None) -> web.StreamResponse:
    resp = _SseResponse(headers={"Content-Type": SSE_CONTENT_TYPE, "Cache-Control": "no-cache"})

    async def start() -> web.StreamResponse:
        await resp.prepare(request)
        return resp

    try:
        return await stream_events(start, runs, is_batch, render)
    except ConnectionResetError:
        if not resp.prepared:
            raise
        # The client left mid-stream: a normal event. The runs are closed by now, which
        # aborted the requests at their workers.
        log.info("client %s left a /generate stream", request.remote)
        return resp


async def stream_events(start: Callable[[], Awaitable[Sink]], runs: list[AsyncIterator[dict[str, Any]]],
                        is_batch: bool, render: Callable[[int, dict[str, Any]], bytes] | None = None) -> Sink:
    """Interleave the items' cumulative chunks as SSE; batch chunks carry ``index``.
    ``render`` turns an item's newest cumulative chunk into the bytes to send. ``start``
    sends the 200 head once the first chunk is there (a rejection before it is raised)."""
    first = [asyncio.ensure_future(r.__anext__()) for r in runs]
    # Surface a rejection before committing to a 200 stream.
    try:
        done, _ = await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled (the lane's client left): the runs must not go on orphaned
        for t in first:
            t.cancel()
        await asyncio.gather(*first, return_exceptions=True)
        raise
    for task in done:
        exc = task.exception()
        if exc is not None and not isinstance(exc, StopAsyncIteration):
            for t in first:
                t.cancel()
            raise exc
    try:
        resp = await start()
    except BaseException:
        for t in first:
            t.cancel()
        raise
    # Chunks are cumulative, so only each item's newest one matters: a client that reads
    # slowly gets fewer, newer chunks (nothing is lost, the last one is whole), and the
    # router holds at most one unsent chunk per item however slowly the client reads.
    count = len(runs)
    latest: list[dict[str, Any] | None] = [None] * count
    ended = [False] * count
    end_event: list[dict[str, Any] | None] = [None] * count
    changed = asyncio.Event()

    async def pump(index: int, run: AsyncIterator[dict[str, Any]], head: asyncio.Future) -> None:
        try:
            chunk = await head
            while True:
                latest[index] = chunk
                changed.set()
                chunk = await run.__anext__()
        except StopAsyncIteration:
            pass
        except (RouterError, WorkerError) as e:
            end_event[index] = answer_for(e).event()
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the client must still learn of it
            log.exception("generate item %s failed", index)
            end_event[index] = {"error": {"message": f"internal router error: {e!r}",
                                          "type": "internal_error", "code": 500}}
        finally:
            ended[index] = True
            changed.set()

    def event(index: int, chunk: dict[str, Any]) -> bytes:
        return b"data: " + fastjson.dumps({**chunk, "index": index} if is_batch else chunk) + b"\n\n"

    event = render or event
    pumps = [asyncio.ensure_future(pump(i, r, h)) for i, (r, h) in enumerate(zip(runs, first))]
    closed = [False] * count
    try:
        while True:
            await changed.wait()
            changed.clear()
            out = []  # what is new for every item, in one write
            for i in range(count):
                chunk = latest[i]
                if chunk is not None:
                    latest[i] = None
                    out.append(event(i, chunk))
                if ended[i] and not closed[i]:
                    closed[i] = True
                    if end_event[i] is not None:
                        out.append(b"data: " + fastjson.dumps(end_event[i]) + b"\n\n")
            if all(closed):
                out.append(b"data: [DONE]\n\n")
                await resp.write_eof(b"".join(out))  # the last events and the body's end together
                break
            if out:
                await resp.write(b"".join(out))  # waits while the client's buffer is full
    finally:  # cancelling the pumps closes the runs, which abort the requests at their workers
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    return resp


class _SseResponse(web.StreamResponse):
    """A stream whose head goes out with its first events (one write, as aiohttp's own
    ``Response`` does), not on its own: the router prepares it only once the first
    chunk is there."""

    _send_headers_immediately = False


async def abort_request(request: web.Request) -> web.Response:
    """Abort every in-flight item whose rid equals or starts with ``rid`` (or all), on every
    worker that holds it, prefill and decode alike, always by its exact rid."""
    st = request.app[ROUTER]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    rid, abort_all = body.get("rid"), body.get("abort_all", False)
    if not isinstance(abort_all, bool) or (not abort_all and (not isinstance(rid, str) or not rid)):
        raise BadRequest("give a non-empty string 'rid' or 'abort_all': true")
    if not abort_all and len(rid) > st.config.limits.max_rid_length:
        raise BadRequest(f"'rid' must be at most {st.config.limits.max_rid_length} characters",
                         kind="limit_max_rid_length")
    entries = st.inflight.matching(None if abort_all else rid)
    await abort(st, entries)
    return web.json_response({"aborted": [e.rid for e in entries]})


async def openai_proxy(request: web.Request) -> web.StreamResponse:
    st = request.app[ROUTER]
    chat = request.path.endswith("chat/completions")
    call = parse_openai(await read_json(request), st.config.limits, chat=chat)
    body = call.body
    tag = trajectory_headers(request.headers, batch=call.sequences > 1)
    trajectory = tag.trajectory
    note_expected_turns(st, tag)
    if openai_generate.eligible(body, chat=chat):
        return await _openai_generate(request, st, body, chat=chat, stream=call.stream, trajectory=trajectory)
    text = json.dumps(body.get("messages") or body.get("prompt") or "")
    key = prefix_key(None, text)
    rids, known = openai_rids(st, body, call.sequences)
    # In the in-flight registry like /generate items: counted in the workers' load, waited
    # for by a drain, aborted by rid. Not movable: the router holds no token ids for them.
    entries = [st.inflight.open(rid, movable=False) for rid in rids]

    def proxy(answer: Answer | None = None) -> Awaitable[web.StreamResponse]:
        return proxy_with_retries(request, st, key, trajectory, body, entries, answer)
    try:
        if call.stream:
            with StreamSlot(st, request.remote):
                return await (proxy() if known else abortable(request, entries, proxy))
        with st.client_watch.watching(request):
            return await (proxy() if known else abortable(request, entries, proxy))
    finally:
        for rid in rids:
            st.inflight.close(rid)


def choice_rids(rid: Any, n: int) -> tuple[str, list[str]]:
    """The answer's id and the rids of its ``n`` choices (one dispatcher item each): the
    client's list (one per choice), or ``rid`` and, for ``n > 1``, ``rid_0`` ..
    ``rid_{n-1}`` (an abort of ``rid`` reaches them all), a router rid when none is given."""
    if isinstance(rid, list):
        if len(rid) != n:
            raise BadRequest(f"'rid' lists {len(rid)} rids for n={n} choices: give one per choice")
        return rid[0], list(rid)
    base = rid or f"pearl-oai-{secrets.token_hex(8)}"
    return base, [base] if n == 1 else [f"{base}_{i}" for i in range(n)]


async def _openai_generate(request: web.Request, st: RouterState, body: dict[str, Any], *, chat: bool,
                           stream: bool, trajectory: str | None) -> web.StreamResponse:
    """Run the request as token ids through the dispatcher, one item per choice: drained,
    migrated and stitched like any ``/generate`` item, rendered back as OpenAI objects."""
    n = body.get("n") or 1
    answer_id, rids = choice_rids(body.get("rid"), n)
    st.inflight.refuse_open(rids)
    ids, max_model_len = await openai_dispatch.prompt_ids(st, body, chat=chat, trajectory=trajectory, what=request.path)
    sampling = openai_generate.sampling_params(body, chat=chat, prompt_len=len(ids), max_model_len=max_model_len,
                                               cap=st.config.limits.max_new_tokens)
    renderer = openai_generate.Renderer(
        rid=answer_id, model=body.get("model") or "default", created=int(st.clock.epoch()), chat=chat,
        include_usage=bool((body.get("stream_options") or {}).get("include_usage")), n=n)
    prompt = tuple(ids)
    runs = [openai_dispatch.whole_text(
        st, st.dispatcher.run(GenerateItem(index=i, rid=rid, text=None, input_ids=prompt, sampling=sampling),
                              trajectory=trajectory, client_stream_interval=1 if stream else None),
        skip_special_tokens=body.get("skip_special_tokens", True)) for i, rid in enumerate(rids)]
    if stream:
        def render(index: int, chunk: dict[str, Any]) -> bytes:
            return b"".join(b"data: " + fastjson.dumps(e) + b"\n\n" for e in renderer.chunks(chunk, index))
        with StreamSlot(st, request.remote):
            return await _stream(request, runs, False, render)
    with st.client_watch.watching(request):
        lasts = await unstreamed_answer(runs, is_batch=True)
    return web.Response(body=fastjson.dumps(renderer.whole(lasts)), content_type="application/json")
