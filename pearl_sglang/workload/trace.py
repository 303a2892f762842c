"""Preemptible-GPU availability traces (Bamboo's p3 trace) scaled to a rollout cluster.

Rows are ``t_ms,add|remove,nodeN``: one spot instance joining or leaving. We count live
instances over time and map the count linearly onto ``0..max_workers`` preemptible
rollout workers: ``workers(t) = round(live(t) / max_live * max_workers)`` with
``max_live`` the trace's peak (32 for p3). With ``max_workers = 6`` TP2 workers this is
the paper's 0-12 preemptible GPUs. A segment is a window ``[start_s, start_s + length_s)``
re-based to 0.
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


def worker_targets(points: list[TracePoint], *, max_workers: int, start_s: float = 0.0,
                   length_s: float | None = None) -> list[WorkerTarget]:
    """The scaled preemptible worker count over a segment, only where it changes."""
    if not points:
        return []
    peak = max(p.live for p in points) or 1
    end = float("inf") if length_s is None else start_s + length_s
    current = max((p for p in points if p.t_s <= start_s), key=lambda p: p.t_s, default=points[0])
    out = [WorkerTarget(0.0, round(current.live / peak * max_workers))]
    for p in points:
        if start_s < p.t_s < end:
            workers = round(p.live / peak * max_workers)
            if workers != out[-1].workers:
                out.append(WorkerTarget(p.t_s - start_s, workers))
    return out


def mean_workers(targets: list[WorkerTarget], length_s: float) -> float:
    total = 0.0
    for cur, nxt in zip(targets, [*targets[1:], WorkerTarget(length_s, 0)]):
        total += cur.workers * (min(nxt.t_s, length_s) - cur.t_s)
    return total / length_s
