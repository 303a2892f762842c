"""Property: no input makes the router answer 5xx, hang or crash. Every endpoint gets
arbitrary bytes, arbitrary JSON and near-valid bodies (right keys, hostile values), with
fuzzed content types and trajectory headers, against a router over a healthy emulated
worker (attach mode) and, for the admin API, a router with its control plane. Examples
are bounded so the folder runs in well under 90 s on two cores."""
from __future__ import annotations

from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.fuzz.conftest import inflight
from tests.fuzz.strategies import (
    admin_bodies, content_types, encoded, generate_bodies, header_text, openai_bodies,
)
from tests.router.conftest import ADMIN_TOKEN

# One client per module; a request that takes longer than this is a hang.
CLIENT = httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0))
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

POSTS = [
    ("POST", "/generate", generate_bodies, 150),
    ("PUT", "/generate", generate_bodies, 40),
    ("POST", "/v1/completions", openai_bodies, 80),
    ("POST", "/v1/chat/completions", openai_bodies, 80),
    ("POST", "/abort_request", admin_bodies, 40),
    ("POST", "/flush_cache", admin_bodies, 20),
    ("POST", "/train_begin", admin_bodies, 20),
    ("POST", "/pearl/gpus", admin_bodies, 20),
]
GETS = ["/v1/models", "/model_info", "/server_info", "/health", "/liveness", "/readiness", "/metrics",
        "/pearl/state", "/nope", "/generate"]


def assert_no_5xx(r: httpx.Response, *, worker_url: str | None = None) -> None:
    """The router never originates a 5xx. It may relay one (as 502 upstream_failed) only
    when the worker itself answers that very request with a 5xx: a worker's bug, which
    the worker's own fuzz test reports."""
    if r.status_code == 502 and worker_url is not None and r.json()["error"]["type"] == "upstream_failed":
        direct = CLIENT.request(r.request.method, worker_url + r.request.url.path, content=r.request.content,
                                headers={"Content-Type": r.request.headers.get("Content-Type", "")})
        assert direct.status_code >= 500, ("router 502, worker", direct.status_code, r.text[:300])
        return
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), r.text[:200]
        assert r.json().get("error"), r.text[:200]


def _headers(ctype: str, turn: str | None, trajectory: str | None, admin: bool) -> dict[str, str]:
    headers = {"Content-Type": ctype} if ctype else {}
    if turn is not None:
        headers["X-Pearl-Turn"] = turn
    if trajectory is not None:
        headers["X-Pearl-Trajectory-Id"] = trajectory
    if admin:
        headers.update(ADMIN)
    return headers


@pytest.mark.parametrize("method,path,bodies,examples", POSTS, ids=[f"{m} {p}" for m, p, _, _ in POSTS])
def test_post_endpoints_never_answer_5xx(fuzz_router, method, path, bodies, examples):
    url, _, worker_url = fuzz_router.value

    statuses: Counter[int] = Counter()

    @settings(FUZZ, max_examples=examples)
    @given(body=encoded(bodies), ctype=content_types,
           turn=st.none() | st.none() | st.integers(0, 50).map(str) | header_text,
           trajectory=st.none() | header_text, admin=st.booleans())
    def run(body, ctype, turn, trajectory, admin):
        r = CLIENT.request(method, url + path, content=body, headers=_headers(ctype, turn, trajectory, admin))
        statuses[r.status_code] += 1
        assert_no_5xx(r, worker_url=worker_url)
        if path == "/generate" and r.status_code == 200 and b'"stream": true' not in body:
            assert r.json()
    run()
    print(method, path, dict(statuses))
    assert inflight(fuzz_router) == 0  # nothing leaked in the router's in-flight registry


@pytest.mark.parametrize("path", GETS)
def test_get_endpoints_never_answer_5xx(fuzz_router, path):
    url = fuzz_router.value[0]

    @settings(FUZZ, max_examples=15)
    @given(query=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3), admin=st.booleans(),
           auth=st.none() | header_text)
    def run(query, admin, auth):
        headers = dict(ADMIN) if admin else ({"Authorization": auth} if auth is not None else {})
        assert_no_5xx(CLIENT.get(url + path, params=query, headers=headers))
    run()


@pytest.mark.parametrize("path", ["/train_begin", "/train_finished", "/update_weights", "/pearl/gpus",
                                  "/pearl/pd_mode", "/abort_request"])
def test_admin_api_with_a_control_plane_never_answers_5xx(fuzz_cluster, path):
    url = fuzz_cluster.value.url
    headers = {"Authorization": "Bearer control-test-token", "Content-Type": "application/json"}

    statuses: Counter[int] = Counter()

    @settings(FUZZ, max_examples=25)
    @given(body=encoded(admin_bodies))
    def run(body):
        r = CLIENT.post(url + path, content=body, headers=headers)
        statuses[r.status_code] += 1
        if r.status_code == 504:  # only a caller's own deadline may run out
            assert b"deadline_s" in body, r.text
            return
        assert_no_5xx(r)
    run()
    print(path, dict(statuses))
