"""Check an OpenAI-compatible body against the router's limits before a worker sees it.

The router forwards OpenAI requests to SGLang's own endpoints (chat templates stay the
worker's), so it reads only the fields its limits and its streaming depend on: ``n``,
the token budgets, the number of prompts, ``stream``, ``stream_options`` and ``rid``.
Everything else is the worker's to validate; its 4xx reaches the client unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pearl_sglang.router.errors import BadRequest
from pearl_sglang.router.limits import Limits


@dataclass(frozen=True)
class OpenAICall:
    body: dict[str, Any]
    stream: bool
    sequences: int


def _optional_int(body: dict[str, Any], key: str, lo: int, hi: int, limit: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {type(value).__name__}")
    if value < lo:
        raise BadRequest(f"'{key}' must be >= {lo}, got {value}")
    if value > hi:
        raise BadRequest(f"'{key}' must be at most {hi}, got {value}", kind=limit)
    return value


def _prompt_count(body: dict[str, Any], chat: bool) -> int:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("'messages' must be a non-empty list of message objects")
        return 1
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, list) for p in prompt) or all(isinstance(p, str) for p in prompt):
            return len(prompt)
        return 1  # one prompt given as token ids
    raise BadRequest("'prompt' must be a string, a list of strings, or token ids")


def _check_rids(rid: Any, limits: Limits) -> None:
    if rid is None:
        return
    rids = [rid] if isinstance(rid, str) else rid
    if not isinstance(rids, list) or not rids or not all(isinstance(r, str) and r for r in rids):
        raise BadRequest("'rid' must be a non-empty string or a non-empty list of them")
    if any(len(r) > limits.max_rid_length for r in rids):
        raise BadRequest(f"'rid' must be at most {limits.max_rid_length} characters", kind="limit_max_rid_length")
    if len(set(rids)) != len(rids):
        raise BadRequest("'rid' list must not repeat a rid")


def parse_openai(body: Any, limits: Limits, *, chat: bool) -> OpenAICall:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    n = _optional_int(body, "n", 1, limits.max_n, "limit_n") or 1
    for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
        _optional_int(body, key, 0, limits.max_new_tokens, "limit_max_new_tokens")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise BadRequest("'stream_options' must be an object such as {\"include_usage\": true}")
    sequences = _prompt_count(body, chat) * n
    if sequences > limits.max_batch_size:
        raise BadRequest(f"{sequences} sequences exceed max_batch_size={limits.max_batch_size}",
                         kind="limit_max_batch_size")
    _check_rids(body.get("rid"), limits)
    body = {k: v for k, v in body.items() if k not in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
    return OpenAICall(body=body, stream=bool(stream), sequences=sequences)
