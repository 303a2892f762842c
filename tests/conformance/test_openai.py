"""OpenAI-compatible endpoints as rollout clients use them."""
from __future__ import annotations

import pytest

from tests.support.http import get, post, sse_events

pytestmark = pytest.mark.realsglang


def test_chat_completion(worker):
    r = post(worker.url + "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "fix the failing test"}],
        "max_completion_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] <= 8
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]


def test_chat_completion_streaming(worker):
    events = sse_events(worker.url + "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 6, "temperature": 0, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert isinstance(text, str)
    assert any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)


def test_completions(worker):
    r = post(worker.url + "/v1/completions", {"model": "m", "prompt": "the agent", "max_tokens": 5,
                                              "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion"
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] <= 5


def test_models(worker):
    out = get(worker.url + "/v1/models").json()
    assert out["data"] and out["data"][0]["id"]


def test_n_choices_count_the_prompt_once_and_every_completion(worker):
    body = {"model": "m", "messages": [{"role": "user", "content": "three tries"}],
            "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    one = post(worker.url + "/v1/chat/completions", body).json()
    r = post(worker.url + "/v1/chat/completions", {**body, "n": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert out["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == 12
    events = sse_events(worker.url + "/v1/chat/completions",
                        {**body, "n": 3, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage = [e["usage"] for e in events[:-1] if e.get("usage")]
    assert events[-2].get("usage") and events[-2]["choices"] == []
    assert usage[-1]["prompt_tokens"] == one["usage"]["prompt_tokens"] and usage[-1]["completion_tokens"] == 12
    finished = sorted(c["index"] for e in events[:-1] for c in e["choices"] if c.get("finish_reason"))
    assert finished == [0, 1, 2]


USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details", "reasoning_tokens",
              "completion_tokens_details"]


def test_answer_and_event_shapes(worker):
    """The shapes a router renders OpenAI answers in (router/openai_generate.py) and the
    emulator answers in: SGLang 0.5.23's, key for key."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "shapes"}], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True}
    out = post(worker.url + "/v1/chat/completions", chat).json()
    assert list(out) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert list(out["choices"][0]) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert list(out["choices"][0]["message"]) == ["role", "content", "reasoning_content"]
    assert list(out["usage"]) == USAGE_KEYS and out["usage"]["reasoning_tokens"] == 0
    assert list(out["metadata"]) == ["weight_version", "weight_versions"]
    events = sse_events(worker.url + "/v1/chat/completions",
                        {**chat, "stream": True, "stream_options": {"include_usage": True}})
    choices = [e["choices"][0] for e in events[:-1] if e["choices"]]
    assert all(list(e) == ["id", "object", "created", "model", "choices"] for e in events[:-2])
    assert choices[0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert all(list(c["delta"]) == ["reasoning_content", "content"] and c["delta"]["content"] for c in choices[1:-1])
    assert choices[-1]["delta"] == {"reasoning_content": None} and choices[-1]["finish_reason"] == "length"
    assert [c["finish_reason"] for c in choices[:-1]] == [None] * (len(choices) - 1)
    assert events[-2]["choices"] == [] and list(events[-2]["usage"]) == USAGE_KEYS

    completion = {"model": "m", "prompt": "shapes", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    events = sse_events(worker.url + "/v1/completions",
                        {**completion, "stream": True, "stream_options": {"include_usage": True}})
    texts = [e for e in events[:-2]]
    assert all(list(e) == ["id", "object", "created", "model", "choices", "usage"] and e["usage"] is None
               for e in texts)
    assert texts[-1]["choices"][0]["finish_reason"] == "length" and texts[-1]["choices"][0]["text"]
    assert list(events[-2]["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "reasoning_tokens"]
