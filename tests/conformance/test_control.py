"""Control endpoints PEARL's control plane drives: info, loads, abort, pause, weights."""
from __future__ import annotations

import threading
import time

import pytest

from tests.support.http import get, post, sse_events

pytestmark = pytest.mark.realsglang

LONG = {"temperature": 0, "max_new_tokens": 3000, "ignore_eos": True}


class Background(threading.Thread):
    """Run one blocking call in a thread and keep its result or error."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - surfaced by value()
            self.error = e

    def value(self, timeout=60):
        self.join(timeout)
        assert not self.is_alive(), "background call did not finish"
        if self.error:
            raise self.error
        return self.result


def wait_running(worker, n=1, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loads = get(worker.url + "/v1/loads").json()["loads"]
        if sum(entry["num_running_reqs"] for entry in loads) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("request never started running")


def test_health(worker):
    assert get(worker.url + "/health").status_code == 200


def test_model_info(worker):
    info = get(worker.url + "/model_info").json()
    for key in ("model_path", "weight_version", "disaggregation_mode", "is_generation"):
        assert key in info
    assert info["disaggregation_mode"] == "null"


def test_server_info(worker):
    info = get(worker.url + "/server_info").json()
    for key in ("tp_size", "disaggregation_mode", "max_total_num_tokens", "version", "internal_states"):
        assert key in info
    assert info["max_total_num_tokens"] > 0


def test_loads(worker):
    out = get(worker.url + "/v1/loads").json()
    entry = out["loads"][0]
    for key in ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "num_total_tokens"):
        assert key in entry


def test_flush_cache_when_idle(worker):
    r = post(worker.url + "/flush_cache")
    assert r.status_code == 200
    assert "flushed" in r.text.lower()


def test_abort_by_exact_rid_keeps_partial_output(worker):
    call = Background(lambda: post(worker.url + "/generate", {
        "text": "the agent edits", "rid": "abortme-7", "sampling_params": LONG}).json())
    wait_running(worker)
    time.sleep(0.3)
    assert post(worker.url + "/abort_request", {"rid": "abortme-7"}).status_code == 200
    out = call.value()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(out["output_ids"]) < 3000
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"])


def test_abort_by_bare_prefix_is_ignored_with_one_tokenizer_worker(worker):
    """0.5.23 dispatches an abort only when the exact rid is known to the tokenizer manager
    (``tokenizer_worker_num == 1``), so a batch's items must be aborted by their own rids
    (``{rid}_{i}``); the router therefore always aborts with the exact rids it sent."""
    params = {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}
    call = Background(lambda: post(worker.url + "/generate", {
        "input_ids": [[5, 6, 7], [8, 9, 10]], "rid": "pfx", "sampling_params": params},
        timeout=300).json())
    wait_running(worker, n=2)
    post(worker.url + "/abort_request", {"rid": "pfx"})
    post(worker.url + "/abort_request", {"rid": "pfx_0"})
    first, second = call.value(timeout=300)
    assert first["meta_info"]["finish_reason"]["type"] == "abort"
    assert second["meta_info"]["finish_reason"] == {"type": "length", "length": 1500}


def test_streaming_abort_ends_with_abort_chunk_then_done(worker):
    call = Background(lambda: sse_events(worker.url + "/generate", {
        "text": "the agent edits", "rid": "sabort-1", "stream": True, "sampling_params": LONG}))
    wait_running(worker)
    time.sleep(0.3)
    # Re-send the abort until the stream ends, as the router's drain does: on a loaded
    # machine one abort can reach the tokenizer before it knows the rid, and is ignored.
    for _ in range(60):
        post(worker.url + "/abort_request", {"rid": "sabort-1"})
        call.join(0.5)
        if not call.is_alive():
            break
    events = call.value()
    assert events[-1] == "[DONE]", events[-3:]
    last = events[-2]
    # What a failure needs to be read: how far the stream got and how it ended.
    seen = f"{len(events)} events, last: {last.get('meta_info') if isinstance(last, dict) else last}"
    assert last["meta_info"]["finish_reason"]["type"] == "abort", seen
    if len(events) > 2:
        assert len(last["output_ids"]) >= len(events[-3]["output_ids"]), seen


def test_resubmitting_partial_output_continues_token_for_token(worker):
    """The router's partial-trajectory retention depends on this (float32 weights)."""
    prompt_ids = [101, 202, 303, 404, 505, 606]
    greedy = {"temperature": 0, "ignore_eos": True}
    full = post(worker.url + "/generate", {"input_ids": prompt_ids, "sampling_params": {
        **greedy, "max_new_tokens": 40}}).json()
    post(worker.url + "/flush_cache")  # force a full re-prefill, the harder case
    first = post(worker.url + "/generate", {"input_ids": prompt_ids, "sampling_params": {
        **greedy, "max_new_tokens": 15}}).json()
    rest = post(worker.url + "/generate", {"input_ids": prompt_ids + first["output_ids"],
                                           "sampling_params": {**greedy, "max_new_tokens": 25}}).json()
    assert first["output_ids"] + rest["output_ids"] == full["output_ids"]


def test_pause_abort_mode_then_continue(worker):
    running = Background(lambda: post(worker.url + "/generate", {
        "text": "pause me", "sampling_params": LONG}).json())
    wait_running(worker)
    try:
        r = post(worker.url + "/pause_generation", {"mode": "abort"})
        assert r.status_code == 200 and r.json()["status"] == "ok"
        out = running.value()
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        waiting = Background(lambda: post(worker.url + "/generate", {
            "text": "while paused", "sampling_params": {"temperature": 0, "max_new_tokens": 4}}).json())
        time.sleep(1.0)
        assert waiting.is_alive(), "a request sent while paused must wait"
    finally:
        r = post(worker.url + "/continue_generation", {})
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert waiting.value()["meta_info"]["finish_reason"]["type"] == "length"


def test_update_weights_from_disk_sets_version(worker, tiny_model_dir, tiny_model_variant_dir):
    body = {"text": "weights change outputs", "sampling_params": {
        "temperature": 0, "max_new_tokens": 10, "ignore_eos": True}}
    before = post(worker.url + "/generate", body).json()
    try:
        r = post(worker.url + "/update_weights_from_disk", {
            "model_path": str(tiny_model_variant_dir), "load_format": "auto", "weight_version": "v2"})
        assert r.status_code == 200 and r.json()["success"], r.text
        assert get(worker.url + "/model_info").json()["weight_version"] == "v2"
        after = post(worker.url + "/generate", body).json()
        assert after["meta_info"]["weight_version"] == "v2"
        assert after["meta_info"]["weight_versions"] == [{"version": "v2", "start": 0, "end": 10}]
        assert after["output_ids"] != before["output_ids"]
    finally:
        r = post(worker.url + "/update_weights_from_disk", {
            "model_path": str(tiny_model_dir), "load_format": "auto", "weight_version": "default"})
    assert r.json()["success"]
    assert post(worker.url + "/generate", body).json()["output_ids"] == before["output_ids"]


def test_update_weights_from_bad_path_fails_and_keeps_version(worker, tmp_path):
    r = post(worker.url + "/update_weights_from_disk", {
        "model_path": str(tmp_path / "missing"), "load_format": "auto", "weight_version": "bad"})
    assert r.status_code == 400 or not r.json()["success"]
    assert get(worker.url + "/model_info").json()["weight_version"] == "default"
