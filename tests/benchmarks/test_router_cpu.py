"""The router benchmarks' CPU accounting: per request, for the router and its workers,
and how evenly the workers were used."""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

from benchmarks.harness.process_cpu import cpu_now, cpu_per_request, process_cpu_ns
from benchmarks.router_agentic import markdown, summarize


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


def test_process_cpu_ns_counts_every_thread_of_a_process_exactly():
    before = process_cpu_ns(os.getpid())

    def spin() -> None:
        x = 0
        for i in range(300_000):
            x += i

    t = threading.Thread(target=spin)
    t.start()
    t.join()  # another thread's CPU counts, and this one's up to now
    spin()
    after = process_cpu_ns(os.getpid())
    assert before is not None and after is not None and after - before > 1_000_000  # > 1 ms, in ns
    assert process_cpu_ns(None) is None and process_cpu_ns(2 ** 22 + 12345) is None


def test_the_agentic_table_sets_one_clients_router_cpu_beside_its_added_latency():
    rows = []
    for rep in range(2):
        for target, warm, waited in (("direct", None, None), ("pearl", 0.5, 1.25), ("relay", 0.08, 0.2)):
            lat = {"phase": "lat_1", "p50_ms": 2.0 + (waited or 0.0)}
            if waited is not None:
                lat["router_cpu_ms_while_waited"] = waited
            tp = {"phase": "tp", **({"router_cpu_ms_per_req": warm} if warm else {})}
            for cell in (lat, tp):
                rows.append({"workload": "4k", "mode": "nonstream", "target": target, "repeat": rep,
                             "rps": 1000.0, "p50_ms": 2.0, **cell})
    names = ["direct", "pearl", "relay"]
    summary = summarize(rows, names)
    assert summary["4k/nonstream"]["pearl"]["cpu_ms_while_waited_1"] == pytest.approx(1.25)
    text = markdown(summary, names, SimpleNamespace(agentic_concurrency=64, repeats=2))
    assert "| 4k | nonstream | pearl | +1.25 | 1.25 | 0.50 | 2.5 |" in text
    assert "| 4k | nonstream | relay | +0.20 | 0.20 | 0.08 | 2.5 |" in text
    assert "| 4k | nonstream | direct | +" not in text  # no router, no row
