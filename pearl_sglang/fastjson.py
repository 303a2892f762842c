"""JSON on the request path, through orjson (a dependency of SGLang itself).

Rollout bodies carry whole multi-turn contexts as ``input_ids`` (tens of thousands of
integers), so the standard library's encoder and decoder are a large share of the
router's CPU.  Errors are ``ValueError`` subclasses (``orjson.JSONDecodeError`` is a
``json.JSONDecodeError``), so callers keep catching what they caught before.
"""
from __future__ import annotations

from typing import Any

import orjson

JSON_HEADERS = {"Content-Type": "application/json"}


def _fragment(obj: Any) -> orjson.Fragment:
    """Ids the router kept as their JSON text (``router.encoded_ids``) are written as that text."""
    fragment = getattr(obj, "json_fragment", None)
    if fragment is None:
        raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")
    return fragment()


def dumps(obj: Any) -> bytes:
    """numpy arrays are written as lists (a workload's contexts are int64 arrays)."""
    return orjson.dumps(obj, default=_fragment, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)
