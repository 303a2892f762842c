"""A ``/generate`` body whose ``input_ids`` is one flat array, parsed without a Python
loop per token and without decoding the ids.

Agentic rollouts send whole multi-turn contexts (tens of thousands of ids) on every turn.
Decoding them into Python ints, checking each one's type and sign, and encoding them
again for the worker cost more than all the rest of a request. Here the array is cut out
of the raw bytes: when its text holds only digits, commas and whitespace, every element
is a non-negative integer by construction (no bools, floats, strings or nesting), so one
compiled pass over the text (``encoded_ids.parse_ids``) replaces the per-element
checks, reads the ids (or drops the whitespace) and refuses what a JSON decoder would
(empty elements, leading zeros, numbers too long for 64 bits). The ids stay text
(``EncodedIds``); only the rest of the body, now small, is decoded. Whatever does not
fit this shape (batches, text prompts, a second ``input_ids`` anywhere, odd formatting)
returns None and takes the general path, which gives the same answers and errors as before.

The worker gets the array's text as it came (without its whitespace), so the router
never re-encodes the ids.
"""
from __future__ import annotations

from typing import Any, Callable

from pearl_sglang import fastjson
from pearl_sglang.router.encoded_ids import EncodedIds, parse_ids

_KEY = b'"input_ids"'
_WHITESPACE = b" \t\r\n"
# Stands in for the array while the rest of the body is decoded: a string no client
# can send as a flat int array, and that proves the cut-out array was the top-level key.
_SENTINEL = "\x00pearl-input-ids"
_SENTINEL_JSON = b'"\\u0000pearl-input-ids"'


def split_ids(raw: bytes) -> tuple[bytes, EncodedIds] | None:
    """(the body with the array replaced by a sentinel, the ids as their canonical text),
    or None when ``raw`` is not a body with one flat array of non-negative integers."""
    at = raw.find(_KEY)
    if at < 0 or raw.find(_KEY, at + len(_KEY)) >= 0:
        return None
    i = at + len(_KEY)
    n = len(raw)
    while i < n and raw[i] in _WHITESPACE:
        i += 1
    if i >= n or raw[i] != 0x3A:  # ':'
        return None
    i += 1
    while i < n and raw[i] in _WHITESPACE:
        i += 1
    if i >= n or raw[i] != 0x5B:  # '['
        return None
    end = raw.find(b"]", i)
    if end < 0:
        return None
    ids = parse_ids(raw[i + 1:end])
    if ids is None:
        return None  # ",,", a trailing comma, a leading zero, too long for 64 bits, not an id
    return raw[:at] + _KEY + b":" + _SENTINEL_JSON + raw[end + 1:], ids


def parse_ids_body(raw: bytes, *, too_deep: Callable[[bytes, object], bool]) -> dict[str, Any] | None:
    """The decoded body, its ``input_ids`` the validated row (``EncodedIds``), or None
    (take the general path). ``too_deep(text, body)`` runs on the body without the ids
    (they are flat) and the text it was decoded from: None if it says so, and the
    general path refuses the body."""
    split = split_ids(raw)
    if split is None:
        return None
    rest, ids = split
    try:
        body = fastjson.loads(rest)
    except ValueError:
        return None  # the general path decodes the original and names the error
    if not isinstance(body, dict) or body.get("input_ids") != _SENTINEL or too_deep(rest, body):
        return None
    body["input_ids"] = ids
    return body
