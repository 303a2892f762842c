"""Would the last rollout step have ended sooner with the overlap workers?  A
counterfactual from the step's own telemetry, checked before a borrow.

Equation (7) predicts the saving from the makespan model on a fresh batch.  Two things
it does not see decide whether a borrow pays: when the overlap workers start serving
(training ends mid-rollout, and they launch or resume only after that), and whether the
trajectory that ends the step spends its time in requests a larger pool would speed up
or in its environment.  Measured on the decision-quality grid (Qwen3-30B-A3B,
cache-friendly, 16 reserved GPUs, batch 64): the update ended 102 s into a 301 s
rollout, the eight overlap workers launched for 80 s and served the last 119 s, and the
step's end was one trajectory's (183 s in its environment, 117 s in requests with the
workers, 117 s without); borrowing lost 0.8% while equation (7) predicted 109 s saved.

So when the last step ran unborrowed, the gate replays it:

* each trajectory's turns in order from the step's start, its environment time before a
  turn and the turn's request (arrival to last token), as the router measured them;
* requests that begin after ``join_after_s`` (the time the step in progress has run
  plus the time overlap workers take to serve once lent, as measured) take ``speedup``
  times as long: a decode iteration ``A + b n`` at the larger pool's concurrency over the
  dedicated pool's, with ``n`` the requests in flight per dedicated worker (Little's law:
  the step's summed request time over its span and workers) and the larger pool's ``n``
  scaled by ``dedicated / (dedicated + overlap)``, the even spread placement makes;
* the step ends with its slowest trajectory, in both.

The saving is the difference of the two ends, in the profile's seconds; a borrow that
equation (7) would make is refused when the saving does not exceed ``T_toggle``.  The
replay is optimistic in the same direction as equation (7) (every request gets the
whole speedup), so a refusal means even that does not pay.  Pure: the shell hands the
step's telemetry and the measured times over.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import GateDecision
from pearl_sglang.core.telemetry import StepTelemetry

# One trajectory: (environment seconds before the turn, the turn's request seconds) per turn.
Turns = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class StepTimeline:
    """An unborrowed step's trajectories, its span and the dedicated workers that served it."""

    trajectories: tuple[Turns, ...]
    span_s: float
    workers: int

    def __post_init__(self) -> None:
        if not (self.span_s > 0 and math.isfinite(self.span_s)):
            raise InvalidConfig(f"span_s must be a finite number > 0, got {self.span_s!r}", key="span_s")
        if self.workers < 1:
            raise InvalidConfig(f"workers must be >= 1, got {self.workers!r}", key="workers")
        for turns in self.trajectories:
            for env, request in turns:
                if not (env >= 0 and request >= 0 and math.isfinite(env + request)):
                    raise InvalidConfig("turn times must be finite and >= 0", key="trajectories")

    @classmethod
    def of(cls, step: StepTelemetry, *, workers: int) -> "StepTimeline | None":
        """The timeline of ``step`` (profile seconds); None when it cannot be replayed (no
        measured request time, no span, no worker)."""
        if workers < 1 or not (step.span_s > 0 and math.isfinite(step.span_s)):
            return None
        by: dict[str, list[tuple[int, float, float]]] = {}
        for t in step.turns:
            by.setdefault(t.trajectory_id, []).append((t.turn_index, t.env_time_s, t.request_s))
        if not any(r > 0 for turns in by.values() for _, _, r in turns):
            return None
        return cls(tuple(tuple((env, r) for _, env, r in sorted(turns)) for turns in by.values()),
                   step.span_s, workers)

    @property
    def concurrency(self) -> float:
        """Requests in flight per worker over the span (Little's law)."""
        return sum(r for turns in self.trajectories for _, r in turns) / (self.span_s * self.workers)


@dataclass(frozen=True)
class ReplaySaving:
    saved_s: float
    join_after_s: float
    speedup: float
    concurrency: float

    def to_dict(self) -> dict[str, Any]:
        return {"saved_s": self.saved_s, "join_after_s": self.join_after_s, "speedup": self.speedup,
                "concurrency": self.concurrency}

    def describe(self) -> str:
        return (f"the last step replayed with the overlap workers serving from {self.join_after_s:.0f} s "
                f"(requests x{self.speedup:.2f}) ends {self.saved_s:.1f} s sooner")


def speedup(*, A: float, b: float, concurrency: float, dedicated: int, overlap: int) -> float:
    """A decode iteration's time with the overlap workers over without, in ``(0, 1]``."""
    if dedicated < 1 or overlap < 0:
        raise InvalidConfig(f"need dedicated >= 1 and overlap >= 0, got {dedicated}, {overlap}", key="workers")
    alone = A + b * concurrency
    if not (alone > 0 and math.isfinite(alone)):
        return 1.0
    return min(1.0, max(0.0, (A + b * concurrency * dedicated / (dedicated + overlap)) / alone))


def _end(trajectories: tuple[Turns, ...], *, join_after_s: float, factor: float) -> float:
    """When the slowest trajectory ends, requests begun from ``join_after_s`` on taking
    ``factor`` times as long."""
    end = 0.0
    for turns in trajectories:
        t = 0.0
        for env, request in turns:
            t += env
            t += request * factor if t >= join_after_s else request
        end = max(end, t)
    return end


def replay_saving(timeline: StepTimeline, *, join_after_s: float, A: float, b: float,
                  overlap_workers: int) -> ReplaySaving:
    """How much sooner ``timeline`` would have ended with ``overlap_workers`` more workers
    serving from ``join_after_s`` on (module docstring)."""
    if not (join_after_s >= 0 and math.isfinite(join_after_s)):
        raise InvalidConfig(f"join_after_s must be a finite number >= 0, got {join_after_s!r}", key="join_after_s")
    n = timeline.concurrency
    f = speedup(A=A, b=b, concurrency=n, dedicated=timeline.workers, overlap=overlap_workers)
    without = _end(timeline.trajectories, join_after_s=math.inf, factor=1.0)
    with_them = _end(timeline.trajectories, join_after_s=join_after_s, factor=f)
    return ReplaySaving(saved_s=without - with_them, join_after_s=join_after_s, speedup=f, concurrency=n)


def replay_guard(decision: GateDecision, saving: ReplaySaving | None) -> GateDecision:
    """``decision`` unless it borrows and the replayed saving does not exceed its toggle cost."""
    if not decision.borrow or saving is None or saving.saved_s > decision.toggle_cost_s:
        return decision
    why = f"{saving.describe()} (<= T_toggle {decision.toggle_cost_s:.3g} s)"
    return replace(decision, borrow=False, overruled=why, reason=f"not borrowing: {why}; {decision.reason}")
