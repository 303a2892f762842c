"""CPU time of the benchmarks' server processes (routers, workers), read from outside.

One reader: a process's POSIX CPU clock (``clock_getcpuclockid(3)``), user + system time
of all its threads, exact and up to date (``/proc/<pid>/stat`` counts 10 ms clock ticks,
and ``schedstat`` lags a running thread), so it can bracket a whole cell or one request.
"""
from __future__ import annotations

import time
from typing import Sequence

from pearl_sglang.router.utilization import busiest_over_mean


def process_cpu_ns(pid: int | None) -> int | None:
    """CPU nanoseconds so far of a process, or None (no pid, or the process is gone)."""
    if pid is None:
        return None
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except OSError:
        return None


def cpu_s(pid: int | None) -> float | None:
    """CPU seconds so far of a process, or None."""
    ns = process_cpu_ns(pid)
    return None if ns is None else ns / 1e9


def cpu_now(router: int | None, workers: Sequence[int] = ()) -> tuple[float | None, list[float | None]]:
    """CPU seconds so far of a router and of each of its workers."""
    return cpu_s(router), [cpu_s(pid) for pid in workers]


def cpu_per_request(before: tuple[float | None, list[float | None]],
                    after: tuple[float | None, list[float | None]], n: int) -> dict[str, float]:
    """Microseconds of CPU per request between two ``cpu_now`` readings: the router's, its
    workers' together, and the busiest worker's CPU over the workers' mean (how evenly
    the router spread the work). Left out where a process could not be read."""
    out: dict[str, float] = {}
    if not n:
        return out
    if before[0] is not None and after[0] is not None:
        out["router_cpu_us"] = (after[0] - before[0]) * 1e6 / n
    used = [a - b for b, a in zip(before[1], after[1]) if a is not None and b is not None]
    if used and len(used) == len(before[1]):
        out["workers_cpu_us"] = sum(used) * 1e6 / n
        busiest = busiest_over_mean(used)
        if busiest is not None:
            out["workers_busiest_over_mean"] = busiest
    return out
