"""Property: malformed requests of every kind, on every endpoint, get a 4xx with a JSON
message, never a 5xx and never an empty 200 (a stream that carries only ``[DONE]``).

The bodies break one rule at a time: nesting past the depth limit, values past each limit
of docs/limits.md, wrong types, hostile ``X-Pearl-Turn``/``X-Pearl-Trajectory-Id`` header
bytes. CI runs a few hundred examples; set ``PEARL_FUZZ_MALFORMED=10000`` for the full
run (derandomized: the same examples every time)."""
from __future__ import annotations

import json
import os
from collections import Counter

from hypothesis import HealthCheck, given, settings, strategies as st

from tests.fuzz.conftest import inflight
from tests.fuzz.strategies import generate_bodies, json_values, openai_bodies
from tests.fuzz.test_router_fuzz import ADMIN, CLIENT, assert_no_5xx

EXAMPLES = int(os.environ.get("PEARL_FUZZ_MALFORMED", "400"))
ENDPOINTS = [("POST", "/generate"), ("PUT", "/generate"), ("POST", "/v1/completions"),
             ("POST", "/v1/chat/completions"), ("POST", "/abort_request"), ("POST", "/flush_cache")]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BASES = {"/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
         "/v1/completions": {"prompt": "hi", "max_tokens": 2}, "/v1/chat/completions": CHAT,
         "/abort_request": {"rid": "r"}, "/flush_cache": {}}


def _nest(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


deep = st.tuples(st.integers(65, 1100), json_values).map(lambda t: _nest(*t))
past_limits = st.sampled_from([
    {"sampling_params": {"max_new_tokens": 10_000_000}}, {"sampling_params": {"n": 1000}},
    {"max_tokens": 10_000_000}, {"max_completion_tokens": 10_000_000}, {"n": 1000}, {"n": 0}, {"n": "3"},
    {"rid": "r" * 300}, {"prompt": ["a"] * 600}, {"input_ids": [[1]] * 600}, {"stream": "yes"},
    {"messages": []}, {"messages": "hi"}, {"max_tokens": -1}, {"max_tokens": 1.5},
    # Each was a 500, a worker crash mid-stream or a leaked in-flight entry once.
    {"rid": []}, {"rid": ["d", "d"], "n": 2}, {"stream_options": "x"}, {"stream_options": [1]},
    {"min_tokens": "x"}, {"min_tokens": 1e300}, {"sampling_params": {"min_new_tokens": 1e300}},
    {"return_logprob": []}, {"lora_path": ["a", "b"]},
])
# Bytes HTTP allows in a header value (visible ASCII, space, obs-text); others are the HTTP
# parser's to refuse before any handler runs.
header_bytes = st.binary(min_size=1, max_size=300).map(
    lambda b: bytes(c for c in b if c >= 0x21 and c != 0x7f) or b"x")
turn_headers = st.one_of(
    st.none(), st.integers(10, 6000).map(lambda n: b"9" * n),
    st.text(alphabet=st.characters(categories=["Nd", "No"]), min_size=1, max_size=4).map(str.encode),
    header_bytes,
)


@st.composite
def malformed(draw):
    method, path = draw(st.sampled_from(ENDPOINTS))
    base = dict(BASES[path])
    kind = draw(st.sampled_from(["deep", "limit", "hostile", "headers"]))
    if kind == "deep":
        base[draw(st.sampled_from(["custom_labels", "x", "rid", "sampling_params", "messages"]))] = draw(deep)
    elif kind == "limit":
        base.update(draw(past_limits))
    elif kind == "hostile":
        base = draw(generate_bodies if path == "/generate" else openai_bodies)
    base_stream = draw(st.booleans())
    if isinstance(base, dict) and path != "/abort_request" and base_stream and "stream" not in base:
        base["stream"] = True
    turn = draw(turn_headers) if kind == "headers" else draw(st.none() | turn_headers)
    trajectory = draw(st.none() | header_bytes)
    return method, path, json.dumps(base).encode(), turn, trajectory


def assert_not_empty_200(r, body: bytes) -> None:
    if r.status_code != 200:
        return
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line for line in r.text.splitlines() if line.startswith("data:")]
        assert any(e.strip() != "data: [DONE]" for e in events), ("empty 200 stream", body[:200], r.text[:200])
    else:
        assert r.content.strip() and r.json() not in (None, {}, []), ("empty 200", body[:200], r.text[:200])


def test_malformed_requests_get_a_4xx_never_a_5xx_or_an_empty_200(fuzz_router):
    url, _, worker_url = fuzz_router.value
    statuses: Counter[int] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request=malformed(), admin=st.booleans())
    def run(request, admin):
        method, path, body, turn, trajectory = request
        headers = {"Content-Type": "application/json", **(ADMIN if admin else {})}
        if turn is not None:
            headers["X-Pearl-Turn"] = turn
        if trajectory is not None:
            headers["X-Pearl-Trajectory-Id"] = trajectory
        r = CLIENT.request(method, url + path, content=body, headers=headers)
        statuses[r.status_code] += 1
        assert_no_5xx(r, worker_url=worker_url)
        assert_not_empty_200(r, body)
    run()
    print("malformed requests by status:", dict(statuses), "total", sum(statuses.values()))
    assert sum(statuses.values()) >= EXAMPLES * 0.9
    assert inflight(fuzz_router) == 0
