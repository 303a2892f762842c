"""Preemptible-GPU availability traces (Bamboo's p3 trace) scaled to a rollout cluster.

Rows are ``t_ms,add|remove,nodeN``: one spot instance joining or leaving. We count live
instances over time and map the count linearly onto ``0..max_workers`` preemptible
rollout workers: ``workers(t) = live(t) / max_live * max_workers`` rounded half up, with
``max_live`` the trace's peak (32 for p3). With ``max_workers = 6`` TP2 workers this is
the paper's 0-12 preemptible GPUs. Rounding half up gives even bins: every count from 1
to ``max_workers - 1`` covers the same span of ``max_live / max_workers`` live instances
(0 and ``max_workers`` half a span each), where Python's ``round`` (half to even) would
widen the even counts' bins and narrow the odd ones'. A segment is a window
``[start_s, start_s + length_s)`` re-based to 0; before a trace's first event no instance
is live, so a window that starts earlier starts from zero workers.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

BAMBOO_P3 = Path(__file__).resolve().parents[1] / "data" / "bamboo-p3-trace.csv"


@dataclass(frozen=True)
class TracePoint:
    t_s: float
    live: int


@dataclass(frozen=True)
class WorkerTarget:
    t_s: float
    workers: int


def read_bamboo(path: str | Path) -> list[TracePoint]:
    """Live instance count after every event (events at one time collapse to one point)."""
    live: set[str] = set()
    points: list[TracePoint] = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or not row[0].strip().isdigit():
                continue
            t_ms, op, node = int(row[0]), row[1].strip(), row[2].strip()
            if op == "add":
                live.add(node)
            elif op == "remove":
                live.discard(node)
            else:
                raise ValueError(f"unknown trace operation {op!r} at t={t_ms}")
            point = TracePoint(t_ms / 1000.0, len(live))
            if points and points[-1].t_s == point.t_s:
                points[-1] = point
            else:
                points.append(point)
    return points


def scaled_workers(live: int, *, peak: int, max_workers: int) -> int:
    """``live / peak * max_workers`` rounded half up, in integers (no float ties)."""
    return (2 * live * max_workers + peak) // (2 * peak)


def worker_targets(points: list[TracePoint], *, max_workers: int, start_s: float = 0.0,
                   length_s: float | None = None) -> list[WorkerTarget]:
    """The scaled preemptible worker count over a segment, only where it changes."""
    if not points:
        return []
    peak = max(p.live for p in points) or 1
    end = float("inf") if length_s is None else start_s + length_s
    # The count before the trace's first event is 0: read_bamboo starts from no instance.
    live = max((p for p in points if p.t_s <= start_s), key=lambda p: p.t_s, default=TracePoint(start_s, 0)).live
    out = [WorkerTarget(0.0, scaled_workers(live, peak=peak, max_workers=max_workers))]
    for p in points:
        if start_s < p.t_s < end:
            workers = scaled_workers(p.live, peak=peak, max_workers=max_workers)
            if workers != out[-1].workers:
                out.append(WorkerTarget(p.t_s - start_s, workers))
    return out


def mean_workers(targets: list[WorkerTarget], length_s: float) -> float:
    total = 0.0
    for cur, nxt in zip(targets, [*targets[1:], WorkerTarget(length_s, 0)]):
        total += cur.workers * (min(nxt.t_s, length_s) - cur.t_s)
    return total / length_s
