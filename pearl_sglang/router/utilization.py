"""Per-worker utilization as the router sees it, per worker and per rollout step.

For each worker slot: busy time (seconds with at least one request of this router in
flight there), prefill tokens it computed (prompt minus cache hits), generated tokens,
cache-hit tokens and requests finished. Totals feed ``/metrics`` (labels slot and role);
``close_step`` (called when a rollout step ends, at ``/train_begin``) files the step's
numbers, with the busiest worker's busy time over the mean, so an idle part of the pool
shows as imbalance instead of passing for a floor. Time comes from an injected clock.
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable


@dataclass
class WorkerUsage:
    busy_s: float = 0.0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0


def busiest_over_mean(values: list[float]) -> float | None:
    """max / mean over the workers (None when nothing was done)."""
    total = sum(values)
    return max(values) / (total / len(values)) if values and total > 0 else None


def summarize(per_worker: dict[int, WorkerUsage]) -> dict[str, Any]:
    busy = [u.busy_s for u in per_worker.values()]
    gen = [float(u.generated_tokens) for u in per_worker.values()]
    return {"workers": {str(s): asdict(u) for s, u in sorted(per_worker.items())},
            "busy_busiest_over_mean": busiest_over_mean(busy),
            "generated_busiest_over_mean": busiest_over_mean(gen),
            "workers_used": sum(1 for u in per_worker.values() if u.requests or u.busy_s)}


class Utilization:
    def __init__(self, clock: Callable[[], float], max_steps: int = 64) -> None:
        self.clock = clock
        self.totals: dict[int, WorkerUsage] = {}
        self._step: dict[int, WorkerUsage] = {}
        self._busy_since: dict[int, float] = {}
        self.steps: deque[dict[str, Any]] = deque(maxlen=max_steps)
        self._step_started: float | None = None
        self._closed = 0

    def _usage(self, slot: int) -> tuple[WorkerUsage, WorkerUsage]:
        if slot not in self.totals:
            self.totals[slot] = WorkerUsage()
        if slot not in self._step:
            self._step[slot] = WorkerUsage()
        return self.totals[slot], self._step[slot]

    def occupancy(self, slot: int, before: int, after: int) -> None:
        """The in-flight count on ``slot`` went from ``before`` to ``after``."""
        if before == 0 and after > 0:
            now = self.clock()
            self._busy_since[slot] = now
            if self._step_started is None:
                self._step_started = now
        elif before > 0 and after == 0 and slot in self._busy_since:
            self._add_busy(slot, self.clock() - self._busy_since.pop(slot))

    def _add_busy(self, slot: int, seconds: float) -> None:
        for u in self._usage(slot):
            u.busy_s += seconds

    def completed(self, slot: int, *, prompt_tokens: int, cached_tokens: int, generated_tokens: int) -> None:
        for u in self._usage(slot):
            u.prefill_tokens += max(0, prompt_tokens - cached_tokens)
            u.cached_tokens += cached_tokens
            u.generated_tokens += generated_tokens
            u.requests += 1

    def close_step(self) -> dict[str, Any]:
        now = self.clock()
        for slot, since in list(self._busy_since.items()):  # busy across the boundary: split
            if since < now:  # one that began at this instant is the new step's alone
                self._add_busy(slot, now - since)
            self._busy_since[slot] = now
        step = {"index": self._closed, "started": self._step_started, "ended": now, **summarize(self._step)}
        self._closed += 1
        self.steps.append(step)
        # A worker still busy is busy in the new step from now (its time was split above).
        self._step, self._step_started = {}, (now if self._busy_since else None)
        return step

    def _with_open(self, per_worker: dict[int, WorkerUsage]) -> dict[int, WorkerUsage]:
        """Copies with the busy periods still open counted up to now."""
        now = self.clock()
        out = {slot: WorkerUsage(**asdict(u)) for slot, u in per_worker.items()}
        for slot, since in self._busy_since.items():
            out.setdefault(slot, WorkerUsage()).busy_s += now - since
        return out

    def current_totals(self) -> dict[int, WorkerUsage]:
        return self._with_open(self.totals)

    def state(self) -> dict[str, Any]:
        return {"totals": summarize(self.current_totals()), "current_step": summarize(self._with_open(self._step)),
                "last_step": self.steps[-1] if self.steps else None}
