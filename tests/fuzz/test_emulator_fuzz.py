"""Property: the emulator, like SGLang, answers malformed input with a 4xx, never a 5xx,
a hang or a crash. Lifecycle endpoints that pause generation or reload weights change
what later examples see and are covered by the conformance suite instead."""
from __future__ import annotations

import contextlib
from collections import Counter

import pytest

from hypothesis import given, settings, strategies as st

from tests.fuzz.conftest import ServerThread
from tests.fuzz.strategies import admin_bodies, content_types, encoded, generate_bodies, openai_bodies
from tests.fuzz.test_router_fuzz import CLIENT, FUZZ
from tests.support.emulated import emulator


@pytest.fixture(scope="module")
def fuzz_emulator():
    @contextlib.asynccontextmanager
    async def make():
        async with emulator("--time-scale", "200") as (url, _):
            yield url
    with ServerThread(make) as server:
        yield server.value


POSTS = [
    ("/generate", generate_bodies, 120),
    ("/v1/completions", openai_bodies, 60),
    ("/v1/chat/completions", openai_bodies, 60),
    ("/abort_request", admin_bodies, 20),
    ("/update_weight_version", admin_bodies, 20),
]


@pytest.mark.parametrize("path,bodies,examples", POSTS, ids=[p for p, _, _ in POSTS])
def test_emulator_post_endpoints_never_answer_5xx(fuzz_emulator, path, bodies, examples):
    statuses: Counter[int] = Counter()

    @settings(FUZZ, max_examples=examples)
    @given(body=encoded(bodies), ctype=content_types)
    def run(body, ctype):
        r = CLIENT.post(fuzz_emulator + path, content=body, headers={"Content-Type": ctype} if ctype else {})
        statuses[r.status_code] += 1
        assert r.status_code < 500, (r.status_code, r.text[:300])
    run()
    print(path, dict(statuses))


@pytest.mark.parametrize("path", ["/v1/loads", "/model_info", "/server_info", "/health", "/metrics", "/v1/models"])
def test_emulator_get_endpoints_never_answer_5xx(fuzz_emulator, path):
    @settings(FUZZ, max_examples=10)
    @given(query=st.dictionaries(st.sampled_from(["include", "format", "x"]), st.text(max_size=12), max_size=2))
    def run(query):
        r = CLIENT.get(fuzz_emulator + path, params=query)
        assert r.status_code < 500, (r.status_code, r.text[:300])
    run()


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": [0, 1, -1], "max_tokens": 2}),
    ("/v1/completions", {"prompt": [0, 1, 10**9], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": ["hello"], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}, 3], "max_tokens": 2}),
], ids=["negative-token-id", "token-id-beyond-vocab", "message-is-a-string", "message-is-a-number"])
def test_emulator_rejects_bad_openai_inputs(fuzz_emulator, path, body):
    r = CLIENT.post(fuzz_emulator + path, json=body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
