"""The stitcher on its own: one response out of the attempts of a request that moved."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from pearl_sglang.router.stitch import Stitcher, merge_spans


def chunk(ids: list[int], text: str, reason: dict | None = None, **meta) -> dict:
    return {"output_ids": ids, "text": text,
            "meta_info": {"id": "worker-rid", "finish_reason": reason, "prompt_tokens": 7,
                          "cached_tokens": 3, "num_retractions": 0, "weight_version": "v1", **meta}}


def test_one_attempt_is_the_workers_chunk_under_the_clients_rid():
    s = Stitcher("client-rid")
    s.update(chunk([5, 6], "ab"))
    out = s.merged()
    assert out["output_ids"] == [5, 6] and out["text"] == "ab"
    meta = out["meta_info"]
    assert meta["id"] == "client-rid" and meta["completion_tokens"] == 2
    # Unfinished: no spans and no latency yet, and no attempt count for a request that never moved.
    assert "weight_versions" not in meta and "e2e_latency" not in meta and "pearl_attempts" not in meta
    s.update(chunk([5, 6, 7], "abc", {"type": "length", "length": 3}, e2e_latency=9.0))
    meta = s.merged(e2e_latency=0.25)["meta_info"]
    assert meta["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]
    assert meta["e2e_latency"] == 0.25 and meta["finish_reason"] == {"type": "length", "length": 3}


def test_a_moved_request_reads_as_one_response():
    s = Stitcher("r")
    s.update(chunk([1, 2], "x", num_retractions=1,
                   output_token_logprobs=[[-0.1, 1, None], [-0.2, 2, None]]))
    s.next_attempt()  # the worker left after two tokens
    s.update(chunk([3], "y", {"type": "length", "length": 1}, weight_version="v2",
                   output_token_logprobs=[[-0.3, 3, None]], output_token_logprobs_length=1))
    out = s.merged(e2e_latency=1.0)
    assert out["output_ids"] == [1, 2, 3] and out["text"] == "xy"
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 3 and meta["num_retractions"] == 1
    assert meta["finish_reason"] == {"type": "length", "length": 3}  # the whole output's length
    assert meta["weight_versions"] == [{"version": "v1", "start": 0, "end": 2},
                                       {"version": "v2", "start": 2, "end": 3}]
    assert [t[1] for t in meta["output_token_logprobs"]] == [1, 2, 3]
    assert meta["output_token_logprobs_length"] == 3 and meta["pearl_attempts"] == 2
    # The first attempt's prompt and cache counts describe the request.
    assert meta["prompt_tokens"] == 7 and meta["cached_tokens"] == 3


def test_an_attempt_that_produced_nothing_leaves_no_segment():
    s = Stitcher("r")
    s.update(chunk([1], "a"))
    s.next_attempt()
    s.next_attempt()  # the second attempt failed before its first token
    assert s.merged()["output_ids"] == [1]  # the last kept segment answers until a new chunk
    s.update(chunk([2], "b", {"type": "stop", "matched": 2}))
    out = s.merged()
    assert out["output_ids"] == [1, 2] and out["meta_info"]["pearl_attempts"] == 3
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}


segments = st.lists(st.tuples(st.lists(st.integers(0, 9), min_size=1, max_size=5), st.sampled_from(["v1", "v2"])),
                    min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(segments)
def test_finished_spans_tile_the_output(parts):
    """However the output was split, the spans of a finished response cover it once, in
    order, adjacent spans of one version merged."""
    s = Stitcher("r")
    for i, (ids, version) in enumerate(parts):
        if i:
            s.next_attempt()
        last = i == len(parts) - 1
        s.update(chunk(ids, "t", {"type": "length", "length": len(ids)} if last else None, weight_version=version))
    meta = s.merged()["meta_info"]
    spans = meta["weight_versions"]
    total = sum(len(ids) for ids, _ in parts)
    assert spans[0]["start"] == 0 and spans[-1]["end"] == total == meta["completion_tokens"]
    assert all(a["end"] == b["start"] and a["version"] != b["version"] for a, b in zip(spans, spans[1:]))
    assert merge_spans(spans) == spans
