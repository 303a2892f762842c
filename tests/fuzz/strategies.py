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
hostile_generate = st.fixed_dictionaries({}, optional={
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
hostile_openai = st.fixed_dictionaries({}, optional={
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
hostile_admin = st.fixed_dictionaries({}, optional={
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


# Valid bodies (with valid optional extras) reach the workers and the control plane; the
# hostile ones above probe validation. Valid ones are drawn twice as often.
prompt_text = st.text(min_size=1, max_size=30)
prompt_ids = st.lists(st.integers(0, 1000), min_size=1, max_size=12)
valid_sampling = st.fixed_dictionaries({"max_new_tokens": st.integers(0, 12)}, optional={
    "min_new_tokens": st.integers(0, 4), "n": st.integers(1, 3), "stream_interval": st.integers(1, 4),
    "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 40),
    "ignore_eos": st.booleans(), "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
    "stop_token_ids": st.lists(st.integers(0, 1000), max_size=3), "sampling_seed": st.integers(0, 2**31),
    "skip_special_tokens": st.booleans(), "no_stop_trim": st.booleans(),
})
valid_generate = st.one_of(
    st.fixed_dictionaries({"text": prompt_text | st.lists(prompt_text, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"input_ids": prompt_ids | st.lists(prompt_ids, min_size=1, max_size=3)}),
).flatmap(lambda prompt: st.fixed_dictionaries({**{k: st.just(v) for k, v in prompt.items()}}, optional={
    "sampling_params": valid_sampling, "stream": st.booleans(), "rid": st.text(min_size=1, max_size=20),
    "return_logprob": st.booleans(), "logprob_start_len": st.integers(-1, 5),
    "top_logprobs_num": st.integers(0, 3), "return_text_in_logprobs": st.booleans(),
    "return_prompt_token_ids": st.booleans(), "priority": st.integers(-5, 5),
}))
generate_bodies = st.one_of(valid_generate, valid_generate, hostile_generate)
valid_openai = st.fixed_dictionaries({"model": st.text(max_size=8)}, optional={
    "prompt": prompt_text | st.lists(prompt_text, min_size=1, max_size=2) | prompt_ids,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                                "content": st.text(max_size=20)}), min_size=1, max_size=3),
    "max_tokens": st.integers(1, 12), "temperature": st.floats(0, 2), "stream": st.booleans(),
    "n": st.integers(1, 2), "stop": st.text(min_size=1, max_size=3), "seed": st.integers(0, 1000),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
})
openai_bodies = st.one_of(valid_openai, valid_openai, hostile_openai)
valid_admin = st.one_of(
    st.fixed_dictionaries({"step": st.integers(0, 3)}, optional={"request_id": st.text(min_size=1, max_size=8),
                                                                 "remaining_trajectories": st.floats(0, 100)}),
    st.fixed_dictionaries({"action": st.sampled_from(["join", "leave"]),
                           "gpus": st.lists(st.sampled_from(["d0:0", "t0:1", "p9:0", "zz:3"]), min_size=1, max_size=2)},
                          optional={"deadline_s": st.floats(0.5, 10)}),
    st.fixed_dictionaries({"pd_mode": st.sampled_from(["auto", "colocated", "disaggregated"])}),
    st.fixed_dictionaries({"rid": st.text(min_size=1, max_size=8)}),
    st.fixed_dictionaries({"abort_all": st.just(True)}),
)
admin_bodies = st.one_of(valid_admin, hostile_admin)


def encoded(structured: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Mostly JSON of the structured strategy, sometimes any JSON, sometimes raw bytes."""
    as_json = st.one_of(structured, structured, structured, json_values).map(lambda v: json.dumps(v).encode())
    return st.one_of(as_json, as_json, as_json, as_json, as_json, st.binary(max_size=64),
                     st.text(max_size=30).map(str.encode))


content_types = st.sampled_from(["application/json"] * 8 + ["text/plain", "application/x-www-form-urlencoded", ""])
header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300).map(str.strip)
