"""Priority scheduling (``--enable-priority-scheduling``): the same checks against real
SGLang on CPU and the emulator. One request runs at a time, so the waiting queue's order is
the order in which requests finish."""
from __future__ import annotations

import time

import pytest

from tests.conformance.test_control import Background, wait_running
from tests.support.http import get, post
from tests.support.workers import START_TIMEOUT_S, Worker, WorkerLauncher
from pearl_sglang.control.processes import wait_all_healthy
from pearl_sglang.engine.launch_args import LaunchRole
from tests.conftest import WORKER_KINDS

pytestmark = pytest.mark.realsglang

# Long enough that one request's answer reaches its thread before the next one ends.
SHORT = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}


@pytest.fixture(scope="module", params=WORKER_KINDS)
def priority_worker(request, tiny_model_dir, tmp_path_factory):
    launcher = WorkerLauncher(request.param, tmp_path_factory.mktemp(f"logs-priority-{request.param}"))
    try:
        server = launcher.start("priority", tiny_model_dir, LaunchRole.COLOCATED,
                                extra=("--enable-priority-scheduling", "--max-running-requests", "1"))
        wait_all_healthy([server], timeout=START_TIMEOUT_S)
        yield Worker(kind=request.param, url=server.url, model_dir=tiny_model_dir)
    finally:
        launcher.stop_all()


def _wait_waiting(worker, n, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loads = get(worker.url + "/v1/loads").json()["loads"]
        if sum(entry["num_waiting_reqs"] for entry in loads) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} requests never waited")


def _finish_order(worker, priorities):
    """Occupy the only running slot, queue one short request per priority (in this order),
    and return the priorities in the order their requests finished."""
    finished: list = []

    def one(i, priority):
        def call():
            body = {"input_ids": [100 + i] * 8, "sampling_params": SHORT}
            if priority is not None:
                body["priority"] = priority
            r = post(worker.url + "/generate", body)
            assert r.status_code == 200, r.text
            finished.append(priority)
        return call

    blocker = Background(lambda: post(worker.url + "/generate", {
        "input_ids": [7] * 8, "priority": 1000, "rid": "prio-blocker",
        "sampling_params": {"temperature": 0, "max_new_tokens": 3000, "ignore_eos": True}}))
    wait_running(worker)
    queued = []
    for i, p in enumerate(priorities):
        queued.append(Background(one(i, p)))
        _wait_waiting(worker, i + 1)  # distinct arrival order
    # Free the slot only once every request waits, so the queue's order decides.
    post(worker.url + "/abort_request", {"rid": "prio-blocker"})
    blocker.value(timeout=300)
    for q in queued:
        q.value(timeout=300)
    return finished


def test_higher_priority_values_are_served_first(priority_worker):
    assert _finish_order(priority_worker, [0, 5, 3]) == [5, 3, 0]


def test_equal_priorities_keep_arrival_order_and_missing_priority_goes_last(priority_worker):
    assert _finish_order(priority_worker, [None, 2, 2]) == [2, 2, None]


def test_priority_must_be_an_integer(priority_worker):
    r = post(priority_worker.url + "/generate", {"input_ids": [1, 2], "priority": "high",
                                                 "sampling_params": SHORT})
    assert 400 <= r.status_code < 500
