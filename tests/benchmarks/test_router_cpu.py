"""The router benchmarks' CPU accounting: per request, for the router and its workers,
and how evenly the workers were used."""
from __future__ import annotations

import os

import pytest

from benchmarks.router_agentic import cpu_now, cpu_per_request


def test_cpu_per_request_splits_router_and_workers_and_measures_balance():
    before = (1.0, [2.0, 3.0])
    after = (1.5, [2.6, 3.2])  # workers used 0.6 s and 0.2 s: mean 0.4, busiest 0.6
    out = cpu_per_request(before, after, 1000)
    assert out["router_cpu_us"] == pytest.approx(500.0)
    assert out["workers_cpu_us"] == pytest.approx(800.0)
    assert out["workers_busiest_over_mean"] == pytest.approx(1.5)


def test_a_process_that_could_not_be_read_is_left_out():
    assert cpu_per_request((None, [1.0, None]), (None, [2.0, 3.0]), 10) == {}
    assert cpu_per_request((1.0, []), (2.0, []), 0) == {}
    assert set(cpu_per_request((1.0, []), (2.0, []), 4)) == {"router_cpu_us"}


def test_cpu_now_reads_live_processes_and_not_gone_ones():
    router, workers = cpu_now(os.getpid(), [os.getpid(), 2 ** 22 + 12345])
    assert router is not None and router > 0 and workers[0] is not None and workers[1] is None
    assert cpu_now(None) == (None, [])
