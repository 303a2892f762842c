"""A flat ``input_ids`` prompt stays the JSON text it arrived in: the router validates,
measures and hashes it from that text, and the worker gets the same text back, so a
long context is never decoded into Python ints on the way through."""
from __future__ import annotations

import random

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang import fastjson
from pearl_sglang.control.attach import attached_table
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.connections import start_site
from pearl_sglang.router.encoded_ids import MAX_DIGITS, EncodedIds, canonical_ids, comma_positions, parse_ids
from pearl_sglang.router.selection import TOKEN_BLOCK, context_tokens, extend_prefix_key, prefix_key
from pearl_sglang.router.state import ROUTER
from pearl_sglang.server.compose import build_app
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import WorkerClient
from tests.router.conftest import ADMIN_TOKEN
from tests.support.emulated import emulator


def _decodes(text: bytes) -> bool:
    """Whether a JSON decoder reads ``text`` as ids the text path takes: integers of at
    most MAX_DIGITS digits (orjson also reads 20-digit ones below 2**64 as integers), and
    written without a sign (``-0`` is JSON's 0, left to the general path)."""
    if b"-" in text:
        return False
    try:
        ids = orjson.loads(b"[" + text + b"]")
    except ValueError:
        return False
    return bool(ids) and all(type(i) is int and 0 <= i < 10 ** MAX_DIGITS for i in ids)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789,", max_size=60), st.text(alphabet="0123456789, \t\n\r-.e", max_size=16),
                 st.lists(st.integers(0, 2**64 + 5), min_size=1, max_size=40).map(lambda ids: ",".join(map(str, ids)))))
def test_validation_from_text_agrees_with_a_json_decoder(text):
    """Taken exactly when a JSON decoder reads the ids; the canonical text is the ids as
    JSON writes them, without whitespace, with its commas where they are."""
    raw = text.encode()
    canonical = canonical_ids(raw)
    assert (canonical is not None) == _decodes(raw)
    if canonical is not None:
        compact, commas = canonical
        assert compact == fastjson.dumps(orjson.loads(b"[" + raw + b"]"))[1:-1]
        assert commas.tolist() == comma_positions(compact).tolist()


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789,", max_size=60), st.text(alphabet="0123456789, \t\n\r-.e", max_size=16),
                 st.lists(st.integers(0, 2**64 + 5), min_size=1, max_size=40).map(lambda ids: ",".join(map(str, ids))),
                 st.lists(st.integers(0, 2**63), min_size=1, max_size=3 * TOKEN_BLOCK + 5).map(
                     lambda ids: ", ".join(map(str, ids)))))
def test_parsed_ids_are_the_decoders_with_their_compact_text_and_keys(text):
    """``parse_ids`` takes what ``canonical_ids`` takes; whichever pass read them (compact
    text, or text with whitespace), the ids, their length, their text and their block
    keys are the decoder's."""
    raw = text.encode()
    parsed = parse_ids(raw)
    assert (parsed is not None) == _decodes(raw)
    if parsed is not None:
        ids = orjson.loads(b"[" + raw + b"]")
        assert parsed.decoded() == ids and len(parsed) == len(ids) and parsed == ids
        assert parsed.text == fastjson.dumps(ids)[1:-1] and parsed.as_uint64().tolist() == ids
        assert (parsed.array is not None) == (b" " not in raw and b"\t" not in raw and b"\n" not in raw
                                               and b"\r" not in raw)
        assert prefix_key(parsed, None) == prefix_key(ids, None)
        assert parsed[len(ids) // 2:] == ids[len(ids) // 2:]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 2**63), min_size=1, max_size=4 * TOKEN_BLOCK + 3), st.lists(st.integers(0, 999), max_size=70))
def test_encoded_ids_read_like_the_list(ids, more):
    enc = EncodedIds(fastjson.dumps(ids)[1:-1])
    assert len(enc) == len(ids) == context_tokens(enc, None)
    key = prefix_key(enc, None)
    assert key == prefix_key(ids, None)
    assert extend_prefix_key(key, enc, more) == extend_prefix_key(key, ids, more)
    assert not enc.is_decoded  # length, hashes and the tail after the last block: from the text
    assert fastjson.dumps({"input_ids": enc}) == fastjson.dumps({"input_ids": ids})
    assert enc == ids and list(enc) == ids and enc[len(ids) // 2:] == ids[len(ids) // 2:]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 10 ** MAX_DIGITS - 1), min_size=1, max_size=200))
def test_the_uint64_array_holds_the_ids(ids):
    """Every id the text path takes (up to MAX_DIGITS digits, above int64's range too)
    reads back unchanged, without decoding the text into a list."""
    enc = EncodedIds(fastjson.dumps(ids)[1:-1])
    arr = enc.as_uint64()
    assert arr.dtype == "uint64" and arr.tolist() == ids and not enc.is_decoded


class _Recording:
    """The HTTP transport, keeping every body it sends."""

    def __init__(self, inner: WorkerClient, bodies: list) -> None:
        self.inner, self.bodies = inner, bodies

    def stream_generate(self, *, slot, url, body, every_chunk=True):
        self.bodies.append(body)
        return self.inner.stream_generate(slot=slot, url=url, body=body, every_chunk=every_chunk)

    async def post_json(self, *, slot, url, path, body):
        return await self.inner.post_json(slot=slot, url=url, path=path, body=body)

    async def abort(self, *, url, rid):
        return await self.inner.abort(url=url, rid=rid)

    async def close(self):
        await self.inner.close()


async def test_a_long_prompt_reaches_the_worker_without_being_decoded():
    ids = [random.Random(3).randrange(3, 1000) for _ in range(5000)]
    bodies: list = []
    async with emulator() as (worker, _):
        config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600)
        app = build_app(config, StateStore(attached_table(regular=(worker,))),
                        transport_factory=lambda session, timeouts: _Recording(WorkerClient(session, timeouts), bodies))
        runner, port = await start_site(app, app[ROUTER].connections, "127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(timeout=30) as c:
                for _ in range(2):  # the second turn: the prefix is cached where the first ran
                    r = await c.post(f"http://127.0.0.1:{port}/generate", content=orjson.dumps(
                        {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}),
                        headers={"Content-Type": "application/json"})
                    assert r.status_code == 200, r.text
        finally:
            await runner.cleanup()
    assert r.json()["meta_info"]["prompt_tokens"] == len(ids)
    assert r.json()["meta_info"]["cached_tokens"] > 0
    sent = [b["input_ids"] for b in bodies]
    assert all(isinstance(s, EncodedIds) and not s.is_decoded for s in sent), sent
    assert sent[0] == ids


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**MAX_DIGITS - 1), min_size=1, max_size=300))
def test_ids_written_from_an_array_are_the_checked_text(ids):
    array = np.array(ids, dtype=np.uint64)
    enc = EncodedIds.of_array(array)
    assert enc.text == fastjson.dumps(ids)[1:-1] and canonical_ids(enc.text) is not None
    assert enc == ids and len(enc) == len(ids)
    copy = enc.as_uint64()
    assert copy.tolist() == ids
    copy[0] += 1  # a copy: the ids stay as written
    assert enc.as_uint64().tolist() == ids


@pytest.mark.parametrize("array", [np.array([], dtype=np.int64), np.array([3, -1], dtype=np.int64),
                                   np.array([1.0, 2.0]), np.zeros((2, 2), dtype=np.int64),
                                   np.array([10**MAX_DIGITS], dtype=np.uint64)])
def test_only_arrays_of_ids_are_written(array):
    with pytest.raises(ValueError):
        EncodedIds.of_array(array)
