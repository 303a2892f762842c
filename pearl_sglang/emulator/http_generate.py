"""Generation endpoints: ``/generate`` (single, batch, SSE) and the OpenAI pair.

Each handler parses the body into ``GenerateRequest``s, submits them, and waits on a
per-request event that the engine's callbacks set.  Streams are cumulative (SGLang's
default): every chunk carries the whole output so far, and a slow reader simply gets
fewer, larger chunks.  A client disconnect aborts its requests, and so does the end of
any stream two seconds later, as in SGLang (``runs.after_stream_end``). The run of a
request set, its watches and chunk bodies are ``runs.py``.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from .. import fastjson
from .http_parse import BadRequest, ParsedGenerate, parse_generate, parse_sampling, weight_spans
from .request import Bootstrap, GenerateRequest, RequestHandle, RequestRejected, SamplingParams
from .runs import Run, chunk_body, error_body, final_answer, stream_intervals
from .worker import WORKER

def error_response(status: int, message: str) -> web.Response:
    return web.json_response(error_body(status, message), status=status)


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


def _usage(handles: list[RequestHandle], n: int) -> dict:
    """As SGLang's ``UsageProcessor``: each prompt (and its cached tokens) counted once,
    from the first of its ``n`` choices; every choice's completion."""
    p = sum(h.prompt_tokens for h in handles[::n])
    c = sum(len(h.output_ids) for h in handles)
    cached = sum(h.cached_tokens for h in handles[::n])
    return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c,
            "prompt_tokens_details": {"cached_tokens": cached} if cached else None,
            "reasoning_tokens": 0, "completion_tokens_details": None}


def _openai_rids(rid: Any, prompts: int, n: int) -> list[str]:
    """The rids SGLang 0.5.23 runs an OpenAI request's sequences under: the samples of
    ``n > 1`` get fresh ones (``regenerate_rid``); a batch's one rid becomes ``rid_i``, a
    list gives one per prompt; a single sequence keeps the rid."""
    if n > 1:
        return [uuid.uuid4().hex for _ in range(prompts * n)]
    if isinstance(rid, list):
        if len(rid) != prompts:
            raise BadRequest({"error": {"message": "The specified rids length mismatch with the batch_size "
                                                   "for batch processing."}})
        return [str(r) for r in rid]
    if prompts == 1:
        return [rid or uuid.uuid4().hex]
    return [f"{rid}_{i}" if rid else uuid.uuid4().hex for i in range(prompts)]


async def _openai(request: web.Request, *, chat: bool) -> web.StreamResponse:
    worker = request.app[WORKER]
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest({"error": {"message": "request body must be a JSON object"}})
    if not isinstance(body.get("stream_options") or {}, dict):
        raise BadRequest({"error": {"message": "stream_options must be an object"}})
    codec, ctx = worker.codec, worker.engine.context_length
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest({"error": {"message": "messages must be a non-empty list"}})
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest({"error": {"message": "each message must be an object with a string 'role'"}})
        prompts = [codec.encode(codec.render_chat(messages))]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")  # as SGLang's
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
    rids = _openai_rids(body.get("rid"), len(prompts), n)
    items = []
    for i, p in enumerate([p for p in prompts for _ in range(n)]):
        boot = None
        if body.get("bootstrap_host") is not None or body.get("bootstrap_room") is not None:
            room = body.get("bootstrap_room")
            boot = Bootstrap(str(body.get("bootstrap_host")), body.get("bootstrap_port"),
                             None if room is None else room + i)
        items.append(GenerateRequest(
            rid=rids[i], input_ids=tuple(p),
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
                c["message"] = {"role": "assistant", "content": text, "reasoning_content": None}
            else:
                c["text"] = text
            c.update({"logprobs": None, "finish_reason": reason, "matched_stop": matched})
            choices.append(c)
        return web.json_response({
            "id": run.handles[0].rid, "object": obj, "created": created, "model": model,
            "choices": choices, "usage": _usage(run.handles, n),
            "metadata": {"weight_version": run.handles[0].weight_version or worker.engine.version,
                         "weight_versions": weight_spans(run.handles[0])}})
    resp = await _start_sse(request)
    sent_text = [""] * len(items)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    remaining = [len(items)]
    first = [True] * len(items)

    def chunk(i: int, final: bool) -> list[bytes]:
        """SGLang's events: a chat opens each choice with an empty assistant delta, sends
        text deltas, and ends with a delta-less finish event; a completion's events carry
        ``usage: null`` and its last text carries the finish reason."""
        h = run.handles[i]
        text = run.text(i)
        delta, sent_text[i] = text[len(sent_text[i]):], text
        reason, matched = _finish_fields(h) if final else (None, None)
        envelope = {"id": h.rid, "object": obj + ".chunk" if chat else obj, "created": created, "model": model}
        out = []
        if chat:
            def event(d: dict, why: Any = None, stop: Any = None) -> bytes:
                return _sse({**envelope, "choices": [{"index": i, "delta": {"reasoning_content": None, **d},
                                                      "logprobs": None, "finish_reason": why, "matched_stop": stop}]})
            if first[i]:
                first[i] = False
                out.append(event({"role": "assistant", "content": ""}))
            if delta:
                out.append(event({"content": delta}))
            if final:
                out.append(event({}, reason, matched))
        else:
            out.append(_sse({**envelope, "choices": [{"index": i, "text": delta, "logprobs": None,
                                                      "finish_reason": reason, "matched_stop": matched}],
                             "usage": None}))
        if final:
            remaining[0] -= 1
            if include_usage and remaining[0] == 0:
                usage = _usage(run.handles, n)
                if not chat:  # a streamed completion's usage leaves out what is null
                    usage = {k: v for k, v in usage.items() if v is not None}
                out.append(_sse({**envelope, "choices": [], "usage": usage}))
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
