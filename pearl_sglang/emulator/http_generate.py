"""Generation endpoints: ``/generate`` (single, batch, SSE) and the OpenAI pair.

Each handler parses the body into ``GenerateRequest``s, submits them, and waits on a
per-request event that the engine's callbacks set.  Streams are cumulative (SGLang's
default): every chunk carries the whole output so far, and a slow reader simply gets
fewer, larger chunks.  A client disconnect aborts its requests, and so does the end of
any stream two seconds later, as in SGLang (``after_stream_end``).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from http import HTTPStatus
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from aiohttp import web

from .. import fastjson
from .codec import GrowingText
from .http_parse import BadRequest, ParsedGenerate, meta_info, output_text, parse_generate, parse_sampling
from .request import Bootstrap, GenerateRequest, Progress, RequestHandle, RequestRejected, SamplingParams
from .worker import WORKER, Worker

DONE = b"data: [DONE]\n\n"


_NEVER = 1 << 62  # an output length no request reaches


class _Watch:
    """Wakes the handler when a request finishes or has ``next_at`` output tokens.

    A stream raises ``next_at`` by its interval after each chunk, so the handler wakes
    once per chunk, not once per token (the engine calls back on every token)."""

    __slots__ = ("event", "next_at")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.next_at = 0

    def __call__(self, handle: RequestHandle) -> None:
        if handle.finish_reason is not None or len(handle.output_ids) >= self.next_at:
            self.event.set()


def error_body(status: int, message: str) -> dict:
    if status == 400:
        return {"error": {"message": message}}
    return {"object": "error", "message": message, "type": HTTPStatus(status).phrase, "param": None,
            "code": status}


def error_response(status: int, message: str) -> web.Response:
    return web.json_response(error_body(status, message), status=status)


def _input_logprobs(ids: tuple[int, ...]) -> list:
    return [[None if i == 0 else -((t * 2654435761 + i) % 4000) / 1000.0, t, None]
            for i, t in enumerate(ids)]


STREAM_END_ABORT_DELAY_S = 2.0


def after_stream_end(worker: Worker, items: tuple[GenerateRequest, ...]) -> None:
    """SGLang 0.5.23 gives every streaming response a background task
    (``TokenizerManager.create_abort_task``) that, 2 s after the stream ends, aborts each of
    its rids that still names a live request.  That request can only be a later one that
    reused the rid, so a resubmission under the same rid within those 2 s is aborted.
    Only the deadline is kept here; ``Run`` arms the abort when a rid is reused in time."""
    try:
        now = asyncio.get_running_loop().time()
    except RuntimeError:  # a generator finalized after its loop closed: no later request
        return
    pending = worker.stream_end_aborts
    for rid in list(pending):
        if pending[rid] > now:
            break
        del pending[rid]
    for r in items:
        pending.pop(r.rid, None)
        pending[r.rid] = now + STREAM_END_ABORT_DELAY_S


def _arm_stream_end_aborts(worker: Worker, items: tuple[GenerateRequest, ...]) -> None:
    pending = worker.stream_end_aborts
    if not pending:
        return
    loop = asyncio.get_running_loop()
    for r in items:
        at = pending.get(r.rid)
        if at is not None and at > loop.time():
            loop.call_at(at, worker.engine.abort, r.rid)


class RunClosed(Exception):
    """The worker stopped under a run that a caller in the same process was waiting on."""


class Run:
    """A set of submitted requests and their watches."""

    def __init__(self, worker: Worker, items: tuple[GenerateRequest, ...], stream: bool) -> None:
        self.worker, self.items = worker, items
        self.closed = False
        self.watches = [_Watch() for _ in items]
        self.texts = [GrowingText(worker.codec, r.sampling.skip_special_tokens) for r in items]
        self.handles: list[RequestHandle] = []
        engine = worker.engine
        _arm_stream_end_aborts(worker, items)
        try:
            for req, w in zip(items, self.watches):
                self.handles.append(engine.submit(req, on_update=w if stream else None, on_finish=w))
        except RequestRejected:
            self.abort()
            raise

    def abort(self) -> None:
        for h in self.handles:
            if not h.finished:
                self.worker.engine.abort(h.rid)

    def close(self) -> None:
        """The worker is going away: wake every waiter, which then raises ``RunClosed``."""
        self.closed = True
        for w in self.watches:
            w.event.set()

    async def wait_all(self) -> None:
        try:
            for h, w in zip(self.handles, self.watches):
                while not h.finished:
                    await w.event.wait()
                    w.event.clear()
                    if self.closed:
                        raise RunClosed
        except asyncio.CancelledError:
            self.abort()
            raise

    def body(self, i: int, *, final: bool, at: Optional[Progress] = None) -> dict:
        """Request ``i``'s chunk now, or (``at``) the chunk it would have streamed at that
        progress, which the engine kept instead of waking the stream."""
        h, req = self.handles[i], self.items[i]
        inp = _input_logprobs(req.input_ids) if req.return_logprob else None
        if at is None:
            text, ids = self.text(i), list(h.output_ids)
        else:
            ids = h.output_ids[:at.completion_tokens]
            text = self.worker.codec.decode(ids, skip_special_tokens=req.sampling.skip_special_tokens)
        out = {"text": text,
               "output_ids": ids,
               "meta_info": meta_info(h, req, version=self.worker.engine.version, final=final,
                                      input_logprobs=inp, at=at)}
        if req.return_prompt_token_ids:  # SGLang sends them with every chunk
            out["prompt_token_ids"] = list(req.input_ids)
        return out

    def text(self, i: int) -> str:
        return output_text(self.worker.codec, self.handles[i], self.items[i].sampling, self.texts[i])

    def failed_status(self) -> Optional[tuple[int, str]]:
        for h in self.handles:
            fr = h.finish_reason
            if fr is not None and fr.type == "abort" and (fr.status_code or 0) >= 400:
                return fr.status_code, fr.message or "aborted"
        return None

    async def updates(self, intervals: list[int], *, every_chunk: bool = True) -> AsyncIterator[tuple[int, bool]]:
        """``(i, final)`` whenever request ``i`` has ``intervals[i]`` new tokens or finished.
        ``every_chunk`` False: each request's first chunk and its final one; in between the
        engine keeps what each chunk would have read (``RequestHandle.progress``) and wakes
        no one, so its decode stretches run on past them."""
        sent = [0] * len(self.handles)
        pending = set(range(len(self.handles)))
        for w, h, interval in zip(self.watches, self.handles, intervals):
            w.next_at = h.notify_at = interval
        while pending:
            if len(pending) == 1:
                await self.watches[next(iter(pending))].event.wait()
            elif not any(self.watches[i].event.is_set() for i in pending):
                waits = [asyncio.ensure_future(self.watches[i].event.wait()) for i in pending]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for f in waits:
                    f.cancel()
            if self.closed:
                raise RunClosed
            for i in sorted(pending):
                w, h = self.watches[i], self.handles[i]
                if not w.event.is_set():
                    continue
                w.event.clear()
                n = len(h.output_ids)
                if h.finished:
                    pending.discard(i)
                    yield i, True
                elif n - sent[i] >= intervals[i]:
                    sent[i] = n
                    if every_chunk:
                        w.next_at = h.notify_at = n + intervals[i]
                    else:
                        w.next_at = h.notify_at = _NEVER
                        h.progress_every, h.progress_next = intervals[i], n + intervals[i]
                    yield i, False

    async def stream(self, response: web.StreamResponse, intervals: list[int],
                     chunk: Callable[[int, bool], list[bytes]]) -> None:
        """Send chunks as requests progress; ``chunk(i, final)`` renders SSE lines."""
        try:
            async for i, final in self.updates(intervals):
                for line in chunk(i, final):
                    await response.write(line)
            await response.write(DONE)
        except (asyncio.CancelledError, ConnectionResetError):
            self.abort()
            raise
        finally:
            after_stream_end(self.worker, self.items)


def _sse(obj: Any) -> bytes:
    return b"data: " + fastjson.dumps(obj) + b"\n\n"


async def _start_sse(request: web.Request) -> web.StreamResponse:
    # SGLang (Starlette) adds the charset to every text/* media type.
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json(loads=fastjson.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest({"error": {"message": f"invalid JSON body: {e}"}}) from e


def _guard(fn: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except BadRequest as e:
            return web.json_response(e.body, status=e.status)
        except RequestRejected as e:
            return error_response(e.status, e.message)
    return handler


# ---- /generate -----------------------------------------------------------------------
def stream_intervals(worker: Worker, parsed: ParsedGenerate) -> list[int]:
    return [r.sampling.stream_interval or worker.args.stream_interval for r in parsed.items]


def final_answer(run: Run, parsed: ParsedGenerate) -> tuple[int, Any]:
    """The HTTP status and JSON document of a finished non-streaming run."""
    failed = run.failed_status()
    if failed is not None:
        return failed[0], error_body(*failed)
    bodies = [run.body(i, final=True) for i in range(len(parsed.items))]
    return 200, bodies if parsed.is_batch else bodies[0]


def chunk_body(run: Run, parsed: ParsedGenerate, i: int, final: bool, *, at: Optional[Progress] = None) -> dict:
    body = run.body(i, final=final, at=at)
    if parsed.is_batch:
        body["index"] = i
    return body


async def generate(request: web.Request) -> web.StreamResponse:
    worker = request.app[WORKER]
    parsed: ParsedGenerate = parse_generate(await _json_body(request), worker.codec)
    run = Run(worker, parsed.items, parsed.stream)
    if not parsed.stream:
        await run.wait_all()
        status, answer = final_answer(run, parsed)
        return web.json_response(answer, status=status)
    resp = await _start_sse(request)
    await run.stream(resp, stream_intervals(worker, parsed),
                     lambda i, final: [_sse(chunk_body(run, parsed, i, final))])
    return resp


# ---- OpenAI -----------------------------------------------------------------------------
def _openai_sampling(body: dict, max_tokens: Optional[int], prompt_len: int, ctx: int) -> SamplingParams:
    stop = body.get("stop")
    sp = {k: v for k, v in {
        "max_new_tokens": max_tokens if max_tokens is not None else max(1, ctx - prompt_len - 1),
        "min_new_tokens": body.get("min_tokens"), "stop": stop,
        "stop_token_ids": body.get("stop_token_ids"), "ignore_eos": body.get("ignore_eos"),
        "sampling_seed": body.get("seed"), "no_stop_trim": body.get("no_stop_trim"),
        "skip_special_tokens": body.get("skip_special_tokens"),
    }.items() if v is not None}
    return parse_sampling(sp)


def _finish_fields(h: RequestHandle) -> tuple[Optional[str], Any]:
    fr = h.finish_reason
    if fr is None:
        return None, None
    return fr.type, fr.matched if fr.type == "stop" else None


def _usage(handles: list[RequestHandle]) -> dict:
    p = sum(h.prompt_tokens for h in handles)
    c = sum(len(h.output_ids) for h in handles)
    cached = sum(h.cached_tokens for h in handles)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": cached} if cached else None,
            "reasoning_tokens": 0, "completion_tokens_details": None}


async def _openai(request: web.Request, *, chat: bool) -> web.StreamResponse:
    worker = request.app[WORKER]
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest({"error": {"message": "request body must be a JSON object"}})
    codec, ctx = worker.codec, worker.engine.context_length
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest({"error": {"message": "messages must be a non-empty list"}})
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest({"error": {"message": "each message must be an object with a string 'role'"}})
        prompts = [codec.encode(codec.render_chat(messages))]
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [codec.encode(prompt)]
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            vocab = worker.engine.config.vocab_size or worker.profile.vocab_size
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise BadRequest({"error": {"message": f"token ids must be in [0, {vocab})"}})
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, str) for t in prompt):
            prompts = [codec.encode(t) for t in prompt]
        else:
            raise BadRequest({"error": {"message": "prompt must be a string, a list of strings or token ids"}})
        max_tokens = body.get("max_tokens", 16)
    n = body.get("n") or 1
    base_rid = body.get("rid") or uuid.uuid4().hex
    items = []
    for i, p in enumerate([p for p in prompts for _ in range(n)]):
        boot = None
        if body.get("bootstrap_host") is not None or body.get("bootstrap_room") is not None:
            room = body.get("bootstrap_room")
            boot = Bootstrap(str(body.get("bootstrap_host")), body.get("bootstrap_port"),
                             None if room is None else room + i)
        items.append(GenerateRequest(
            rid=base_rid if len(prompts) * n == 1 else f"{base_rid}_{i}", input_ids=tuple(p),
            sampling=_openai_sampling(body, max_tokens, len(p), ctx), bootstrap=boot))
    model = body.get("model") or worker.served_model_name
    created = int(time.time())
    stream = bool(body.get("stream"))
    run = Run(worker, tuple(items), stream)
    obj = "chat.completion" if chat else "text_completion"
    if not stream:
        await run.wait_all()
        failed = run.failed_status()
        if failed is not None:
            return error_response(*failed)
        choices = []
        for i, h in enumerate(run.handles):
            reason, matched = _finish_fields(h)
            text = run.text(i)
            c: dict = {"index": i}
            if chat:
                c["message"] = {"role": "assistant", "content": text, "reasoning_content": None,
                                "tool_calls": None}
            else:
                c["text"] = text
            c.update({"logprobs": None, "finish_reason": reason, "matched_stop": matched})
            choices.append(c)
        return web.json_response({
            "id": run.handles[0].rid, "object": obj, "created": created, "model": model,
            "choices": choices, "usage": _usage(run.handles),
            "metadata": {"weight_version": run.handles[0].weight_version or worker.engine.version}})
    resp = await _start_sse(request)
    sent_text = [""] * len(items)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    remaining = [len(items)]
    first = [True] * len(items)

    def chunk(i: int, final: bool) -> list[bytes]:
        h = run.handles[i]
        text = run.text(i)
        delta, sent_text[i] = text[len(sent_text[i]):], text
        reason, matched = _finish_fields(h) if final else (None, None)
        if chat:
            d: dict = {"content": delta}
            if first[i]:
                d = {"role": "assistant", "content": delta}
                first[i] = False
            choice = {"index": i, "delta": d, "logprobs": None, "finish_reason": reason,
                      "matched_stop": matched}
        else:
            choice = {"index": i, "text": delta, "logprobs": None, "finish_reason": reason,
                      "matched_stop": matched}
        out = [_sse({"id": h.rid, "object": obj + ".chunk" if chat else obj, "created": created,
                     "model": model, "choices": [choice]})]
        if final:
            remaining[0] -= 1
            if include_usage and remaining[0] == 0:
                out.append(_sse({"id": h.rid, "object": obj + ".chunk" if chat else obj,
                                 "created": created, "model": model, "choices": [],
                                 "usage": _usage(run.handles)}))
        return out
    await run.stream(resp, [worker.args.stream_interval] * len(items), chunk)
    return resp


async def tokenize(request: web.Request) -> web.StreamResponse:
    """SGLang's ``/tokenize``: ``messages`` are rendered with the chat template (as the
    chat endpoint renders them), a ``prompt`` string or list of strings is encoded."""
    worker = request.app[WORKER]
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest({"error": {"message": "request body must be a JSON object"}})
    codec, messages, prompt = worker.codec, body.get("messages"), body.get("prompt")
    if messages is not None:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest({"error": {"message": "messages must be a non-empty list of objects with a 'role'"}})
        tokens: Any = list(codec.encode(codec.render_chat(messages)))
        count: Any = len(tokens)
    elif isinstance(prompt, str):
        tokens = list(codec.encode(prompt))
        count = len(tokens)
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        tokens = [list(codec.encode(p)) for p in prompt]
        count = [len(t) for t in tokens]
    else:
        raise BadRequest({"error": {"message": f"Invalid prompt type: {type(prompt)}. Expected str or List[str]."}})
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": worker.engine.context_length})


async def detokenize(request: web.Request) -> web.StreamResponse:
    """SGLang's ``/detokenize``: ``tokens`` (ids, or a list of id lists) to text."""
    worker = request.app[WORKER]
    body = await _json_body(request)
    body = body if isinstance(body, dict) else {}
    tokens, skip = body.get("tokens"), body.get("skip_special_tokens", True)
    if isinstance(tokens, list) and all(type(t) is int for t in tokens):
        return web.json_response({"text": worker.codec.decode(tokens, skip_special_tokens=bool(skip))})
    if isinstance(tokens, list) and all(isinstance(r, list) and all(type(t) is int for t in r) for r in tokens):
        return web.json_response({"text": [worker.codec.decode(r, skip_special_tokens=bool(skip)) for r in tokens]})
    raise BadRequest({"error": {"message": "Invalid input: 'tokens' must be a list of integers."}})


async def completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=True)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/generate", _guard(generate))
    app.router.add_put("/generate", _guard(generate))
    app.router.add_post("/v1/completions", _guard(completions))
    app.router.add_post("/v1/chat/completions", _guard(chat_completions))
    app.router.add_post("/tokenize", _guard(tokenize))
    app.router.add_post("/v1/tokenize", _guard(tokenize))
    app.router.add_post("/detokenize", _guard(detokenize))
    app.router.add_post("/v1/detokenize", _guard(detokenize))
