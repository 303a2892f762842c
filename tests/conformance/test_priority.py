"""Priority scheduling (``--enable-priority-scheduling``): the same checks against real
SGLang on CPU and the emulator. One request runs at a time, so the waiting queue's order is
the order in which requests finish. Three servers per kind: higher values first (SGLang's
default), lower values first (``--schedule-low-priority-values-first``), and no priority
scheduling (a ``priority`` field is accepted and ignored, which ``--straggler-priority``
relies on for workers launched without it)."""
from __future__ import annotations

import time

import pytest

from tests.conformance.test_control import Background, wait_running
from tests.support.http import get, post
from tests.support.workers import START_TIMEOUT_S, Worker, WorkerLauncher
from benchmarks.harness.servers import wait_all_healthy
from pearl_sglang.core.state import Role
from tests.conftest import WORKER_KINDS

pytestmark = pytest.mark.realsglang

# Long enough that one request's answer reaches its thread before the next one ends, even
# on a loaded 2-core machine (64 tokens were not: two answers once came back swapped).
SHORT = {"temperature": 0, "max_new_tokens": 256, "ignore_eos": True}


ONE_AT_A_TIME = ("--max-running-requests", "1")
MODES = {"high_first": ("--enable-priority-scheduling",),
         "low_first": ("--enable-priority-scheduling", "--schedule-low-priority-values-first"),
         "none": ()}


@pytest.fixture(scope="module", params=WORKER_KINDS)
def priority_workers(request, tiny_model_dir, tmp_path_factory):
    launcher = WorkerLauncher(request.param, tmp_path_factory.mktemp(f"logs-priority-{request.param}"))
    try:
        servers = {mode: launcher.start(f"priority-{mode}", tiny_model_dir, Role.COLOCATED,
                                        extra=flags + ONE_AT_A_TIME)
                   for mode, flags in MODES.items()}
        wait_all_healthy(list(servers.values()), timeout=START_TIMEOUT_S)
        yield {mode: Worker(kind=request.param, url=s.url, model_dir=tiny_model_dir) for mode, s in servers.items()}
    finally:
        launcher.stop_all()


@pytest.fixture
def priority_worker(priority_workers):
    return priority_workers["high_first"]


def _wait_waiting(worker, n, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loads = get(worker.url + "/v1/loads").json()["loads"]
        if sum(entry["num_waiting_reqs"] for entry in loads) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{n} requests never waited")


def _finish_order(worker, priorities, blocker_priority=1000):
    """Occupy the only running slot, queue one short request per priority (in this order),
    and return the priorities in the order their requests finished. The blocker's priority
    is the most preferred, so no queued request preempts it (SGLang would, for a difference
    over its threshold of 10; the emulator does not model preemption)."""
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
        "input_ids": [7] * 8, "priority": blocker_priority, "rid": "prio-blocker",
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


def test_negative_priorities_order_and_a_missing_priority_is_below_all_of_them(priority_worker):
    assert _finish_order(priority_worker, [None, -5, 0, -5]) == [0, -5, -5, None]


def test_low_values_first_serves_lower_values_first_and_a_missing_priority_last(priority_workers):
    worker = priority_workers["low_first"]
    assert _finish_order(worker, [5, None, 1, -3], blocker_priority=-1000) == [-3, 1, 5, None]


def test_without_priority_scheduling_a_priority_is_accepted_and_arrival_order_kept(priority_workers):
    assert _finish_order(priority_workers["none"], [0, 9, None, 5]) == [0, 9, None, 5]


@pytest.mark.parametrize("priority", [1 << 63, -(1 << 63) - 1])
def test_a_priority_outside_signed_64_bits_is_a_4xx(priority_worker, priority):
    r = post(priority_worker.url + "/generate", {"input_ids": [1, 2], "priority": priority,
                                                 "sampling_params": SHORT})
    assert 400 <= r.status_code < 500, r.text
