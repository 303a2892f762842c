"""What the placement benchmark measures beneath its summary: where each request of each
trajectory went, how long it waited in the router and in the worker, cache hits per
worker, and every worker's queue depth over time.

The emulated workers run in the benchmark's process, so the recorder wraps each engine's
``submit`` (the same for PEARL's router and sglang-router: both end in a worker's
``/generate``) and samples each scheduler's running and waiting lists. Times are
emulated seconds (real seconds x the time scale); engine times are the engine's own.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from pearl_sglang.emulator.request import RequestHandle


@dataclass
class RequestRecord:
    rid: str
    worker: int
    sent: float                   # client send, real monotonic seconds
    arrived: float                # worker submit, real monotonic seconds
    prompt_tokens: int
    handle: RequestHandle

    def as_dict(self, time_scale: float, t0: float) -> dict[str, Any]:
        h = self.handle
        first = h.first_token_time if h.first_token_time is not None else h.finish_time
        return {"rid": self.rid, "worker": self.worker, "sent_s": (self.sent - t0) * time_scale,
                "router_wait_s": (self.arrived - self.sent) * time_scale,
                "worker_wait_s": (first - h.arrival_time) if first is not None else None,
                "e2e_in_worker_s": h.e2e_latency, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": h.cached_tokens, "generated_tokens": len(h.output_ids)}


@dataclass
class Recorder:
    """Install on a pool with ``install``; ``sent`` is filled by the client (rid -> time)."""

    workers: list[Any]
    time_scale: float
    sample_every_s: float = 0.05
    sent: dict[str, float] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    samples: list[tuple[float, list[tuple[int, int]]]] = field(default_factory=list)
    t0: float = 0.0

    def install(self) -> None:
        for i, w in enumerate(self.workers):
            engine = w.engine
            original = engine.submit

            def submit(req, *a, _i=i, _orig=original, **kw):
                h = _orig(req, *a, **kw)
                now = time.monotonic()
                self.records.append(RequestRecord(req.rid, _i, self.sent.get(req.rid, now), now,
                                                  len(req.input_ids), h))
                return h
            engine.submit = submit

    def start(self) -> None:
        self.sent.clear()
        self.records.clear()
        self.samples.clear()
        self.t0 = time.monotonic()

    async def sample(self) -> None:
        """Queue depths (running, waiting) per worker until cancelled."""
        while True:
            now = time.monotonic()
            self.samples.append(((now - self.t0) * self.time_scale,
                                 [(len(w.engine.sched.running) + len(w.engine.sched.prefilling),
                                   len(w.engine.sched.waiting)) for w in self.workers]))
            await asyncio.sleep(self.sample_every_s / self.time_scale)

    def report(self) -> dict[str, Any]:
        reqs = [r.as_dict(self.time_scale, self.t0) for r in self.records]
        n = len(self.workers)
        per_worker = []
        for i in range(n):
            mine = [r for r in reqs if r["worker"] == i]
            waits = [r["worker_wait_s"] for r in mine if r["worker_wait_s"] is not None]
            depth = [s[1][i] for s in self.samples]
            per_worker.append({
                "requests": len(mine), "prompt_tokens": sum(r["prompt_tokens"] for r in mine),
                "cached_tokens": sum(r["cached_tokens"] for r in mine),
                "mean_worker_wait_s": sum(waits) / len(waits) if waits else 0.0,
                "max_worker_wait_s": max(waits, default=0.0),
                "mean_running": sum(d[0] for d in depth) / len(depth) if depth else 0.0,
                "max_running": max((d[0] for d in depth), default=0),
                "mean_waiting": sum(d[1] for d in depth) / len(depth) if depth else 0.0,
                "max_waiting": max((d[1] for d in depth), default=0)})
        router = [r["router_wait_s"] for r in reqs]
        paths: dict[str, list[int]] = {}
        for r in sorted(reqs, key=lambda r: r["sent_s"]):
            traj, _turn = r["rid"].rsplit("-", 1)
            paths.setdefault(traj, []).append(r["worker"])
        moves = sum(sum(1 for a, b in zip(p, p[1:]) if a != b) for p in paths.values())
        return {"per_worker": per_worker, "requests": reqs, "trajectory_workers": paths,
                "turn_moves": moves, "mean_router_wait_s": sum(router) / len(router) if router else 0.0,
                "max_router_wait_s": max(router, default=0.0),
                "queue_samples": [[t, d] for t, d in self.samples]}
