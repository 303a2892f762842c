"""Parse a client's ``/generate`` body into typed, single-sequence items.

SGLang accepts batches (list-valued ``text``, ``input_ids`` as a list of lists) and
``n > 1``; the router expands both into independent items so each one gets its own
worker (or its own PD bootstrap room) and can be retained and resubmitted on its own.
Per-item rids follow SGLang: a string rid on a batch becomes ``{rid}_{i}``.
"""
from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pearl_sglang.router.encoded_ids import EncodedIds
from pearl_sglang.router.errors import BadRequest
from pearl_sglang.router.limits import Limits

# Top-level fields that may be given per item as a list the length of the batch.
_PER_ITEM_FIELDS = frozenset({
    "return_logprob", "logprob_start_len", "top_logprobs_num", "lora_path", "custom_labels",
    "priority", "extra_key", "cache_salt", "routing_key",
})
# Fields the router owns: a client's values are dropped (PD placement is the router's job).
_ROUTER_OWNED = frozenset({
    "text", "input_ids", "sampling_params", "rid", "stream", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "bootstrap_pair_key", "routed_dp_rank", "data_parallel_rank",
    "disagg_prefill_dp_rank", "decode_tp_size",
})
_UNSUPPORTED = ("input_embeds",)
# Rids the router gives items that came without one: 32 hex digits like SGLang's uuid4
# rids, a random half per process and a counter (no system call per request).
_RID_PREFIX = secrets.token_hex(8)
_rid_counter = itertools.count()


def _new_rid() -> str:
    return f"{_RID_PREFIX}{next(_rid_counter):016x}"


@dataclass(frozen=True)
class GenerateItem:
    index: int
    rid: str
    text: str | None
    # A tuple, or ``EncodedIds`` (the fast path's ids, still JSON text) for one flat row.
    input_ids: Sequence[int] | None
    sampling: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_new_tokens(self) -> int:
        return int(self.sampling.get("max_new_tokens", 128))

    @property
    def return_logprob(self) -> bool:
        return bool(self.extra.get("return_logprob"))


@dataclass(frozen=True)
class GenerateCall:
    items: tuple[GenerateItem, ...]
    is_batch: bool
    stream: bool


def _int_field(params: Mapping[str, Any], key: str, lo: int, hi: int | None, where: str,
               limit: str | None = None) -> None:
    if key not in params:
        return
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where}.{key} must be an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        kind = (limit or f"limit_{key}") if hi is not None and value > hi else None
        raise BadRequest(f"{where}.{key} must be in [{lo}, {hi if hi is not None else 'inf'}], "
                         f"got {value}", kind=kind)


def _prompts(body: Mapping[str, Any], ids_checked: bool) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("give exactly one of 'text' or 'input_ids'")
    if ids_checked:  # one flat row, validated from its text (ids_body)
        return None, [ids], False
    if text is not None:
        if isinstance(text, str):
            return [text], None, False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return list(text), None, True
        raise BadRequest("'text' must be a string or a non-empty list of strings")
    if isinstance(ids, list) and ids and all(isinstance(i, list) for i in ids):
        rows, batch = ids, True
    elif isinstance(ids, list):
        rows, batch = [ids], False
    else:
        raise BadRequest("'input_ids' must be a list of integers or a list of such lists")
    for row in rows:
        # This runs over every token of long contexts: set(map(type, row)) runs in C, and
        # refuses bools too (type(True) is bool).
        if not row or set(map(type, row)) != {int} or min(row) < 0:
            raise BadRequest("'input_ids' rows must be non-empty lists of non-negative integers")
    return None, rows, batch


def _sampling_list(body: Mapping[str, Any], count: int, limits: Limits) -> list[dict[str, Any]]:
    raw = body.get("sampling_params") or {}
    if isinstance(raw, dict):
        params = [dict(raw) for _ in range(count)]
    elif isinstance(raw, list) and len(raw) == count and all(isinstance(p, dict) for p in raw):
        params = [dict(p) for p in raw]
    else:
        raise BadRequest("'sampling_params' must be an object or a list of objects, one per prompt")
    for p in params:
        _int_field(p, "max_new_tokens", 0, limits.max_new_tokens, "sampling_params")
        _int_field(p, "min_new_tokens", 0, limits.max_new_tokens, "sampling_params", limit="limit_max_new_tokens")
        _int_field(p, "n", 1, limits.max_n, "sampling_params")
        _int_field(p, "stream_interval", 1, None, "sampling_params")
    return params


def _rids(raw: Any, count: int, expanded: bool, limits: Limits) -> list[str]:
    if raw is None:
        return [_new_rid() for _ in range(count)]
    if isinstance(raw, str):
        if not raw or len(raw) > limits.max_rid_length:
            raise BadRequest(f"'rid' must be 1..{limits.max_rid_length} characters",
                             kind="limit_max_rid_length" if raw else None)
        return [f"{raw}_{i}" for i in range(count)] if expanded else [raw]
    if isinstance(raw, list) and len(raw) == count and all(isinstance(r, str) and r for r in raw):
        if len(set(raw)) != len(raw):
            raise BadRequest("'rid' list must not repeat a rid")
        return list(raw)
    raise BadRequest("'rid' must be a string or a list of strings, one per item")


def parse_generate(body: Any, limits: Limits, ids_checked: bool = False) -> GenerateCall:
    """``ids_checked``: ``body["input_ids"]`` is one row ``EncodedIds`` already validated
    (``ids_body``, or a caller in this process)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for key in _UNSUPPORTED:
        if key in body:
            raise BadRequest(f"'{key}' is not supported by the PEARL router")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    texts, id_rows, is_batch = _prompts(body, ids_checked)
    prompts: list[tuple[str | None, Sequence[int] | None]] = (
        [(t, None) for t in texts] if texts is not None
        else [(None, r if isinstance(r, EncodedIds) else tuple(r)) for r in id_rows])
    sampling = _sampling_list(body, len(prompts), limits)
    per_item = {k: v for k, v in body.items() if k in _PER_ITEM_FIELDS}
    shared = {k: v for k, v in body.items() if k not in _ROUTER_OWNED and k not in _PER_ITEM_FIELDS}
    for key, value in per_item.items():
        if isinstance(value, list) and not is_batch:
            raise BadRequest(f"'{key}' is a list, but a list (one entry per prompt) is for a batch only")
        if isinstance(value, list) and len(value) != len(prompts):
            raise BadRequest(f"'{key}' list must have one entry per prompt")
    expanded: list[tuple[int, tuple, dict[str, Any], dict[str, Any]]] = []
    for i, (prompt, params) in enumerate(zip(prompts, sampling)):
        n = params.pop("n", 1)
        extra = dict(shared)
        for key, value in per_item.items():
            extra[key] = value[i] if isinstance(value, list) and is_batch else value
        expanded.extend((i, prompt, params, extra) for _ in range(n))
    if len(expanded) > limits.max_batch_size:
        raise BadRequest(f"{len(expanded)} sequences exceed max_batch_size={limits.max_batch_size}",
                         kind="limit_max_batch_size")
    is_batch = is_batch or len(expanded) > 1
    rids = _rids(body.get("rid"), len(expanded), is_batch, limits)
    items = tuple(
        GenerateItem(index=k, rid=rid, text=prompt[0], input_ids=prompt[1], sampling=params, extra=extra)
        for k, (rid, (_, prompt, params, extra)) in enumerate(zip(rids, expanded)))
    return GenerateCall(items=items, is_batch=is_batch, stream=stream)
