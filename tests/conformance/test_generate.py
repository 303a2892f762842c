"""/generate as the router relies on it: shapes, streaming, batches, finish reasons, errors."""
from __future__ import annotations

import pytest

from tests.support.http import post, sse_events

pytestmark = pytest.mark.realsglang

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def generate(worker, **body):
    r = post(worker.url + "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_single_text_response_shape(worker):
    out = generate(worker, text="the agent reads the issue", sampling_params=GREEDY, rid="shape-1")
    assert isinstance(out["text"], str)
    assert len(out["output_ids"]) == 12
    meta = out["meta_info"]
    assert meta["id"] == "shape-1"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["completion_tokens"] == 12
    assert meta["prompt_tokens"] > 0 and meta["cached_tokens"] >= 0
    assert meta["weight_version"] == "default"
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 12}]
    assert meta["e2e_latency"] > 0


def test_input_ids_and_text_agree(worker):
    by_text = generate(worker, text="def main return", sampling_params=GREEDY)
    ids = list(range(10, 10 + by_text["meta_info"]["prompt_tokens"]))
    by_ids = generate(worker, input_ids=ids, sampling_params=GREEDY)
    assert by_ids["meta_info"]["prompt_tokens"] == len(ids)
    assert len(by_ids["output_ids"]) == 12
    # Greedy decoding is deterministic on the same server.
    again = generate(worker, text="def main return", sampling_params=GREEDY)
    assert again["output_ids"] == by_text["output_ids"]


def test_streaming_chunks_are_cumulative_and_end_with_done(worker):
    body = {"text": "paris is the capital", "sampling_params": GREEDY, "stream": True}
    events = sse_events(worker.url + "/generate", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert "e2e_latency" not in chunks[0]["meta_info"] or len(chunks) == 1
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    plain = generate(worker, text="paris is the capital", sampling_params=GREEDY)
    assert last["output_ids"] == plain["output_ids"]


def test_batch_returns_array_and_expands_rid(worker):
    out = post(worker.url + "/generate", {
        "input_ids": [[11, 12, 13], [21, 22, 23, 24]], "rid": "batch-1",
        "sampling_params": GREEDY}).json()
    assert isinstance(out, list) and len(out) == 2
    assert [o["meta_info"]["id"] for o in out] == ["batch-1_0", "batch-1_1"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [3, 4]


def test_n_greater_than_one_is_a_batch(worker):
    out = post(worker.url + "/generate", {
        "text": "the router", "sampling_params": {**GREEDY, "n": 3}}).json()
    assert isinstance(out, list) and len(out) == 3


def test_finish_reason_stop_on_token(worker):
    first = generate(worker, text="the tests pass", sampling_params=GREEDY)
    stop_id = first["output_ids"][3]
    cut = first["output_ids"].index(stop_id)
    out = generate(worker, text="the tests pass", sampling_params={
        "temperature": 0, "max_new_tokens": 12, "stop_token_ids": [stop_id]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["meta_info"]["completion_tokens"] == cut + 1


def test_unknown_sampling_param_is_400_with_message(worker):
    r = post(worker.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokenz": 3}})
    assert r.status_code == 400
    assert "max_new_tokenz" in r.json()["error"]


def test_missing_prompt_is_400(worker):
    r = post(worker.url + "/generate", {"sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 400
    assert r.json()["error"]["message"]


def test_wrong_type_is_400(worker):
    r = post(worker.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 8.5}})
    assert r.status_code == 400



def test_stream_end_aborts_a_resubmission_that_reuses_its_rid(worker):
    """SGLang aborts, 2 s after a stream ends, any live request under that stream's rid,
    so a resubmission reusing the rid is cut short (why the router gives every attempt of
    a request its own worker-side rid)."""
    first = sse_events(worker.url + "/generate", {
        "text": "resubmit me", "rid": "reused-rid", "stream": True,
        "sampling_params": {**GREEDY, "max_new_tokens": 4}})
    assert first[-2]["meta_info"]["finish_reason"]["type"] == "length"
    again = sse_events(worker.url + "/generate", {
        "text": "resubmit me", "rid": "reused-rid", "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True,
                            "stream_interval": 64}})
    assert again[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(again[-2]["output_ids"]) < 2000
