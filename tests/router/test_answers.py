"""One table says what a client gets for each failure (router/answers.py), and one
mapping turns a worker's HTTP answer into a typed failure (workers/errors.py)."""
from __future__ import annotations

import json

import pytest

from pearl_sglang.router.answers import answer_for
from pearl_sglang.router.errors import BadRequest, ServiceUnavailable
from pearl_sglang.workers.errors import (
    WorkerError, WorkerFailed, WorkerRefused, WorkerRejected, WorkerStalled, WorkerUnavailable, status_error,
)


@pytest.mark.parametrize("status, kind, retryable", [
    (400, WorkerRejected, False), (404, WorkerRejected, False), (422, WorkerRejected, False),
    (408, WorkerFailed, True), (429, WorkerFailed, True), (500, WorkerFailed, True), (503, WorkerFailed, True),
])
def test_a_workers_error_status_is_one_typed_failure(status, kind, retryable):
    e = status_error("3", status, b'{"error": "no"}', path="/generate")
    assert type(e) is kind and e.retryable is retryable and isinstance(e, WorkerError)
    assert str(e).startswith("/generate on 3: ") and "no" in str(e)


def test_retryable_and_permanent_split_the_hierarchy():
    assert WorkerUnavailable.retryable and WorkerStalled.retryable and WorkerFailed.retryable
    assert not WorkerRefused.retryable and not WorkerRejected.retryable
    assert issubclass(WorkerRejected, WorkerRefused) and issubclass(WorkerStalled, WorkerUnavailable)


def test_a_router_error_is_its_own_json():
    answer = answer_for(ServiceUnavailable("none left", kind="no_worker"))
    assert answer.status == 503
    assert answer.event() == {"error": {"message": "none left", "type": "no_worker", "code": 503}}
    response = answer.response()
    assert response.status == 503 and json.loads(response.body)["error"]["type"] == "no_worker"


def test_a_workers_4xx_goes_back_as_it_came():
    body = b'{"object": "error", "message": "bad sampling params", "code": 400}'
    answer = answer_for(WorkerRejected("1", 400, body, "application/json; charset=utf-8"))
    response = answer.response()
    assert response.status == 400 and response.body == body and response.content_type == "application/json"
    assert answer.event() == json.loads(body)
    text = answer_for(WorkerRejected("1", 404, b"Not Found", "text/plain"))
    assert text.event() == {"error": {"message": "Not Found", "code": 404}}


@pytest.mark.parametrize("error", [WorkerUnavailable("2", "refused"), WorkerStalled("2", "silent"),
                                   WorkerFailed("2", "HTTP 500: boom"), WorkerRefused("2", "no memory saver")])
def test_any_other_worker_failure_is_a_502(error):
    answer = answer_for(error)
    assert answer.status == 502
    assert answer.event() == {"error": {"message": str(error), "type": "upstream_failed", "code": 502}}


def test_what_the_table_does_not_know_is_left_to_the_last_line_of_defence():
    assert answer_for(ValueError("x")) is None
    assert answer_for(BadRequest("y")).status == 400
