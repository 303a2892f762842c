"""Which OpenAI requests run through the dispatcher, how their sampling maps onto
``/generate``, and how stitched cumulative chunks render as OpenAI objects."""
from __future__ import annotations

import pytest

from pearl_sglang.router.errors import BadRequest
from pearl_sglang.router.inference_routes import choice_rids
from pearl_sglang.router.openai_generate import Renderer, eligible, sampling_params, tokenize_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_text_single_prompt_requests_are_eligible_and_the_rest_keep_the_proxy():
    assert eligible({**CHAT, "max_tokens": 5, "stream": True, "seed": 3}, chat=True)
    assert eligible({**CHAT, "n": 4}, chat=True) and eligible({"prompt": "x", "n": 2}, chat=False)
    assert eligible({"prompt": "x"}, chat=False) and eligible({"prompt": [1, 2]}, chat=False)
    for extra in ({"tools": []}, {"tools": [], "n": 2}, {"logprobs": True}, {"response_format": {"type": "json_object"}},
                  {"made_up_field": 1}):
        assert not eligible({**CHAT, **extra}, chat=True), extra
    assert not eligible({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, chat=True)
    assert not eligible({"prompt": ["a", "b"]}, chat=False)
    assert tokenize_body({"prompt": [1, 2]}, chat=False) is None
    assert tokenize_body({**CHAT, "chat_template_kwargs": {"x": 1}}, chat=True) == {
        "messages": CHAT["messages"], "chat_template_kwargs": {"x": 1}}


def test_sampling_maps_openai_names_and_sglang_defaults():
    s = sampling_params({"max_completion_tokens": 7, "temperature": 0, "seed": 4, "stop": ["\n"],
                         "min_tokens": 2}, chat=True, prompt_len=10, max_model_len=100, cap=1000)
    assert s == {"max_new_tokens": 7, "temperature": 0, "sampling_seed": 4, "stop": ["\n"], "min_new_tokens": 2}
    assert sampling_params({}, chat=True, prompt_len=10, max_model_len=100, cap=1000) == {"max_new_tokens": 89}
    # Found by fuzzing: a null max_completion_tokens hid max_tokens (SGLang takes either).
    assert sampling_params({"max_completion_tokens": None, "max_tokens": 2}, chat=True, prompt_len=10,
                           max_model_len=100, cap=1000) == {"max_new_tokens": 2}
    assert sampling_params({}, chat=False, prompt_len=10, max_model_len=100, cap=1000) == {"max_new_tokens": 16}


def _out(text: str, n: int, reason=None) -> dict:
    return {"text": text, "output_ids": list(range(n)),
            "meta_info": {"prompt_tokens": 4, "completion_tokens": n, "cached_tokens": 0, "finish_reason": reason}}


def _deltas(events: list) -> list:
    return [(e["choices"][0]["delta"], e["choices"][0]["finish_reason"]) for e in events if e["choices"]]


def test_renderer_sends_sglangs_events_increments_then_finish_reason_and_usage():
    r = Renderer(rid="r", model="m", created=1, chat=True, include_usage=True)
    none = {"reasoning_content": None}
    assert _deltas(r.chunks(_out("Hel", 1))) == [({**none, "role": "assistant", "content": ""}, None),
                                                ({**none, "content": "Hel"}, None)]
    assert _deltas(r.chunks(_out("Hello", 2))) == [({**none, "content": "lo"}, None)]
    last = r.chunks(_out("Hello!", 3, {"type": "stop", "matched": "!"}))
    assert _deltas(last) == [({**none, "content": "!"}, None), (none, "stop")]
    assert last[1]["choices"][0]["matched_stop"] == "!" and last[1]["object"] == "chat.completion.chunk"
    assert last[2]["choices"] == [] and last[2]["usage"] == {
        "prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": None,
        "reasoning_tokens": 0, "completion_tokens_details": None}
    r = Renderer(rid="r", model="m", created=1, chat=False, include_usage=True)
    assert r.chunks(_out("ab", 2))[0] == {"id": "r", "object": "text_completion", "created": 1, "model": "m",
                                           "choices": [{"index": 0, "text": "ab", "logprobs": None,
                                                        "finish_reason": None, "matched_stop": None}],
                                           "usage": None}
    last = r.chunks(_out("abc", 3, {"type": "length", "length": 3}))
    assert last[0]["choices"][0]["text"] == "c" and last[0]["choices"][0]["finish_reason"] == "length"
    assert last[1]["usage"] == {"prompt_tokens": 4, "total_tokens": 7, "completion_tokens": 3, "reasoning_tokens": 0}
    whole = Renderer(rid="r", model="m", created=1, chat=False).whole([_out("ab", 2, {"type": "length", "length": 2})])
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "ab"
    assert whole["choices"][0]["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 2


def test_increments_follow_the_length_sent_as_sglang_streams_them():
    # Found by fuzzing: a final text trimmed at its stop string (shorter than what was sent)
    # was sent whole again, and every later chunk after it too.
    r = Renderer(rid="r", model="m", created=1, chat=False)
    assert r.chunks(_out("ab st", 2))[0]["choices"][0]["text"] == "ab st"
    last = r.chunks(_out("ab ", 3, {"type": "stop", "matched": "st"}))
    assert last[0]["choices"][0]["text"] == "" and last[0]["choices"][0]["finish_reason"] == "stop"
    r = Renderer(rid="r", model="m", created=1, chat=True)
    sent = "".join(e["choices"][0]["delta"].get("content") or "" for text in ("a", "ab", "abc", "abcd")
                   for e in r.chunks(_out(text, len(text))))
    assert sent == "abcd"


def test_choices_render_with_their_index_and_one_usage_once_all_have_finished():
    r = Renderer(rid="g", model="m", created=1, chat=True, include_usage=True, n=2)
    opened = r.chunks(_out("A", 1), 1)
    assert [e["choices"][0]["index"] for e in opened] == [1, 1]
    assert _deltas(opened)[1] == ({"reasoning_content": None, "content": "A"}, None)
    assert [e["choices"][0]["index"] for e in r.chunks(_out("x", 1), 0)] == [0, 0]
    assert _deltas(r.chunks(_out("AB", 2), 1)) == [({"reasoning_content": None, "content": "B"}, None)]
    done1 = r.chunks(_out("AB", 2, {"type": "length", "length": 2}), 1)
    assert _deltas(done1) == [({"reasoning_content": None}, "length")]  # choice 0 still runs: no usage
    done0 = r.chunks(_out("xyz", 3, {"type": "stop", "matched": "z"}), 0)
    assert [e["choices"][0]["index"] for e in done0[:2]] == [0, 0]
    # As SGLang counts n > 1: the prompt once, every choice's completion.
    assert done0[2]["choices"] == [] and done0[2]["usage"]["prompt_tokens"] == 4
    assert done0[2]["usage"]["completion_tokens"] == 5 and done0[2]["usage"]["total_tokens"] == 9
    whole = Renderer(rid="g", model="m", created=1, chat=False, n=2).whole(
        [_out("ab", 2, {"type": "length", "length": 2}), _out("c", 1, {"type": "stop", "matched": None})])
    assert [(c["index"], c["text"], c["finish_reason"]) for c in whole["choices"]] == [
        (0, "ab", "length"), (1, "c", "stop")]
    assert whole["id"] == "g" and whole["usage"]["total_tokens"] == 4 + 3


def test_choice_rids_name_every_choice_so_an_abort_by_the_request_rid_reaches_them():
    assert choice_rids("r", 1) == ("r", ["r"])
    assert choice_rids("r", 3) == ("r", ["r_0", "r_1", "r_2"])
    assert choice_rids(["a", "b"], 2) == ("a", ["a", "b"])
    answer_id, rids = choice_rids(None, 2)
    assert answer_id.startswith("pearl-oai-") and rids == [answer_id + "_0", answer_id + "_1"]
    with pytest.raises(BadRequest, match="one per choice"):
        choice_rids(["a", "b"], 3)
