"""Hypothesis strategies for HTTP bodies: arbitrary JSON, raw bytes, and near-valid
SGLang ``/generate`` and admin bodies (right keys, wrong or extreme values)."""
from __future__ import annotations

import json

from hypothesis import strategies as st

ADMIN_HEADER = "Authorization"

scalars = (st.none() | st.booleans() | st.integers() | st.integers(-3, 300)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=10)
junk = json_values

small_ints = st.integers(-2, 40)
token_ids = st.lists(st.integers(-1, 1200) | st.integers(), min_size=0, max_size=12)
sampling = st.fixed_dictionaries({}, optional={
    "max_new_tokens": small_ints | st.integers() | junk,
    "min_new_tokens": small_ints | junk,
    "n": st.integers(-1, 6) | junk,
    "stream_interval": st.integers(-1, 5) | junk,
    "temperature": st.floats(-1, 3) | junk,
    "top_p": st.floats(-1, 2) | junk,
    "top_k": st.integers(-2, 50) | junk,
    "ignore_eos": st.booleans() | junk,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | junk,
    "stop_token_ids": token_ids | junk,
    "sampling_seed": st.integers() | junk,
    "skip_special_tokens": st.booleans() | junk,
})
generate_bodies = st.fixed_dictionaries({}, optional={
    "text": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=5) | junk,
    "input_ids": token_ids | st.lists(token_ids, max_size=4) | junk,
    "sampling_params": sampling | st.lists(sampling, max_size=4) | junk,
    "rid": st.text(max_size=300) | st.lists(st.text(max_size=8), max_size=4) | junk,
    "stream": st.booleans() | junk,
    "return_logprob": st.booleans() | st.lists(st.booleans(), max_size=4) | junk,
    "logprob_start_len": st.integers(-3, 20) | junk,
    "top_logprobs_num": st.integers(-3, 20) | junk,
    "return_text_in_logprobs": st.booleans() | junk,
    "return_prompt_token_ids": st.booleans() | junk,
    "priority": st.integers() | junk,
    "custom_labels": junk, "lora_path": junk, "extra_key": junk, "routing_key": junk,
    "bootstrap_host": junk, "bootstrap_room": junk, "input_embeds": junk,
})
openai_bodies = st.fixed_dictionaries({}, optional={
    "model": st.text(max_size=10) | junk,
    "prompt": st.text(max_size=30) | st.lists(st.text(max_size=8), max_size=3) | token_ids | junk,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]) | junk,
                                                "content": st.text(max_size=20) | junk}), max_size=3) | junk,
    "max_tokens": small_ints | st.integers() | junk,
    "max_completion_tokens": small_ints | junk,
    "n": st.integers(-1, 4) | junk,
    "stream": st.booleans() | junk,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | junk}) | junk,
    "temperature": st.floats(-1, 3) | junk,
    "stop": st.text(max_size=5) | junk,
    "seed": st.integers() | junk,
    "rid": st.text(max_size=20) | junk,
    "bootstrap_host": junk,
})
admin_bodies = st.fixed_dictionaries({}, optional={
    "step": st.integers(-2, 5) | st.integers() | junk,
    "request_id": st.text(max_size=300) | junk,
    "deadline_s": st.floats(-1, 100) | st.integers() | junk,
    "remaining_trajectories": st.floats(-5, 100) | junk,
    "version": st.text(max_size=300) | junk,
    "model_path": st.text(max_size=20) | junk,
    "load_format": st.text(max_size=8) | junk,
    "distributed": junk,
    "action": st.sampled_from(["join", "leave"]) | junk,
    "gpus": st.lists(st.text(max_size=6) | st.sampled_from(["d0:0", "t0:1", "zz:0"]), max_size=3) | junk,
    "hosts": junk,
    "pd_mode": st.sampled_from(["auto", "colocated", "disaggregated"]) | junk,
    "rid": st.text(max_size=20) | junk,
    "abort_all": st.booleans() | junk,
})


def encoded(structured: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Mostly JSON of the structured strategy, sometimes any JSON, sometimes raw bytes."""
    as_json = st.one_of(structured, json_values).map(lambda v: json.dumps(v).encode())
    return st.one_of(as_json, as_json, as_json, st.binary(max_size=64),
                     st.text(max_size=30).map(str.encode))


content_types = st.sampled_from(["application/json", "application/json", "application/json",
                                 "text/plain", "application/x-www-form-urlencoded", ""])
header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300)
