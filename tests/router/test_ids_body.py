"""A flat ``input_ids`` body takes a path without a Python loop per token; it must accept
and refuse exactly what the general path does, and hash prompts to the same blocks."""
from __future__ import annotations

import json
import random

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang.router.ids_body import parse_ids_body
from pearl_sglang.router.limits import decoded_too_deep, json_depth_exceeds
from pearl_sglang.router.encoded_ids import EncodedIds
from pearl_sglang.router.selection import TOKEN_BLOCK, extend_prefix_key, prefix_key
from tests.router.conftest import running_router
from tests.support.emulated import emulator

DEAD_WORKER = "http://127.0.0.1:9"


def _fast(raw: bytes):
    return parse_ids_body(raw, too_deep=lambda text, body: False)


@pytest.mark.parametrize("raw,ids,text", [
    (b'{"input_ids": [1, 2, 3], "stream": true}', [1, 2, 3], b"1,2,3"),
    (b'{"input_ids":[0,10,200]}', [0, 10, 200], b"0,10,200"),
    (b'{"stream": false, "input_ids" : [\n 7 ,\t8 ] }', [7, 8], b"7,8"),
])
def test_flat_ids_are_decoded_with_their_canonical_text(raw, ids, text):
    got = _fast(raw)
    assert got is not None and got["input_ids"] == ids and got["input_ids"].text == text
    assert got == orjson.loads(raw)


@pytest.mark.parametrize("raw", [
    b'{"input_ids": [1, true]}', b'{"input_ids": [1, 2.5]}', b'{"input_ids": [1, -2]}',
    b'{"input_ids": [1, "2"]}', b'{"input_ids": [1, null]}', b'{"input_ids": [[1, 2]]}',
    b'{"input_ids": []}', b'{"input_ids": [01]}', b'{"input_ids": [1,,2]}', b'{"input_ids": [1, 2,]}',
    b'{"input_ids": [1e3]}', b'{"input_ids": [1], "input_ids": [2]}', b'{"x": {"input_ids": [1]}}',
    b'{"text": "\\"input_ids\\": [1]"}', b'{"input_ids": [1]', b'{"input_ids": [1]} x', b'[{"input_ids": [1]}]',
    b'{"input_ids": [99999999999999999999999]}',
])
def test_anything_else_takes_the_general_path(raw):
    assert _fast(raw) is None


def test_a_body_too_deep_takes_the_general_path():
    raw = b'{"input_ids": [1, 2], "x": [[[[1]]]]}'
    assert parse_ids_body(raw, too_deep=lambda text, body: True) is None


@pytest.mark.parametrize("content,fragment", [
    (b'{"input_ids": [1, true]}', "non-negative integers"),
    (b'{"input_ids": [1, -2]}', "non-negative"),
    (b'{"input_ids": [1, 2.5]}', "non-negative integers"),
    (b'{"input_ids": [], "stream": false}', "non-negative integers"),
    (b'{"input_ids": [1,,2]}', "malformed JSON"),
    (b'{"input_ids": [1, 2], "text": "x"}', "exactly one"),
    (b'{"input_ids": [1, 2], "stream": "yes"}', "'stream'"),
    (b'{"input_ids": [1, 2], "x": ' + b"[" * 200 + b"]" * 200 + b"}", "max_json_depth"),
])
async def test_router_refuses_bad_ids_bodies(content, fragment):
    async with running_router(regular=[DEAD_WORKER]) as (url, _, _):
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.post(url + "/generate", content=content, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert fragment in r.json()["error"]["message"]


async def test_long_prompt_answers_alike_however_it_is_formatted():
    """Compact JSON (fast path) and a spaced, batch-of-one body (general path) reach the
    worker as the same prompt and learn the same prefix blocks."""
    ids = [random.Random(5).randrange(3, 1000) for _ in range(5000)]
    params = {"max_new_tokens": 4, "ignore_eos": True}
    async with emulator() as (worker, _):
        async with running_router(regular=[worker]) as (url, app, _):
            async with httpx.AsyncClient(timeout=30) as c:
                fast = await c.post(url + "/generate", content=orjson.dumps(
                    {"input_ids": ids, "sampling_params": params}), headers={"Content-Type": "application/json"})
                general = await c.post(url + "/generate", json={"input_ids": [ids], "sampling_params": params})
    assert fast.status_code == 200 and general.status_code == 200, (fast.text, general.text)
    assert fast.json()["output_ids"] == general.json()[0]["output_ids"]
    assert fast.json()["meta_info"]["prompt_tokens"] == len(ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=5 * TOKEN_BLOCK), st.integers(0, 5 * TOKEN_BLOCK),
       st.integers(0, 2**40))
def test_block_hashes_keep_prefix_affinity(ids, cut, other):
    key = prefix_key(ids, None)
    assert len(key) == len(ids) // TOKEN_BLOCK
    assert prefix_key(tuple(ids), None) == key
    if ids:  # as text a request brings, and as an array a caller in the process holds
        assert prefix_key(EncodedIds(orjson.dumps(ids)[1:-1]), None) == key
        assert prefix_key(EncodedIds.of_array(np.array(ids)), None) == key
    cut = min(cut, len(ids))
    assert extend_prefix_key(prefix_key(ids[:cut], None), ids[:cut], ids[cut:]) == key
    # Equal prefixes, equal leading hashes; a changed token changes its block and all after.
    changed = ids[:cut] + [other] + ids[cut + 1:]
    k2 = prefix_key(changed, None)
    same = cut // TOKEN_BLOCK
    assert k2[:same] == key[:same]
    if changed != ids:
        assert k2[same:] != key[same:] or same >= len(key)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet="[]{}\"x", max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
                     max_leaves=30)


@given(value=_json, limit=st.integers(1, 8))
def test_counting_brackets_answers_as_walking_the_value(value, limit):
    raw = json.dumps(value).encode()
    assert decoded_too_deep(raw, value, limit) == json_depth_exceeds(value, limit)
