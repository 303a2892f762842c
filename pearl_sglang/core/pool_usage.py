"""Did the last rollout step need more workers?  A measured check on the borrowing gate.

Equation (7) predicts what the overlap workers would save from the makespan model, which
assumes the step is throughput-bound: every worker is busy until the work runs out, so
more workers finish it sooner.  When the step waits on its environment instead, the
dedicated workers sit idle between turns, the cost-aware placement keeps each
trajectory with its prefix on a worker that has room, and borrowed workers get little to
do.  Measured on the decision-quality grid (``benchmarks/results/decision-quality``): in
the environment-bound regime the dedicated workers had a request in flight for 19-61% of
an unborrowed rollout step and the borrowed workers for 1-14% of the time they were
lent, and borrowing lost 0.2-0.4% of throughput at every point; where it paid (+0.8% to
+131%), the dedicated workers were busy 73-100% of an unborrowed step and the borrowed
ones 43-81% of their time (in the elastic replays, where borrowing paid every step,
71-93% and 22-77%).  Equation (7) predicted savings of 17-236 s at the first kind
of point, against a 9.4 s toggle cost.

So the gate also reads what the workers did in the step that just closed (``PoolUsage``,
from the router's per-worker busy time) and refuses a borrow equation (7) would make when

* the step ran unborrowed and its dedicated workers were busy less than
  ``min_dedicated_busy_share`` of it: the pool had room, nothing queued for more workers;
* the step borrowed and the borrowed workers were busy less than
  ``min_borrowed_busy_share`` of the time since they were lent: they were not used.

A refused step runs unborrowed, so the next decision measures the dedicated pool alone
again and borrows as soon as it is short of workers.  Such a step does not teach the
gate's toggle cost (``ToggleCostEstimator``): it is unborrowed because the model was
wrong about it, a biased sample of the model's error without borrowing.  Pure: the shell
passes busy times and spans in one clock's seconds.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import GateDecision


def _share(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidConfig(f"{name} must be a number in [0, 1], got {value!r}", key=name)


@dataclass(frozen=True)
class UsageThresholds:
    """Busy shares below which a borrow is refused (0 turns a check off)."""

    min_dedicated_busy_share: float = 0.65
    min_borrowed_busy_share: float = 0.18

    def __post_init__(self) -> None:
        _share(self.min_dedicated_busy_share, "min_dedicated_busy_share")
        _share(self.min_borrowed_busy_share, "min_borrowed_busy_share")


@dataclass(frozen=True)
class PoolUsage:
    """What the workers of one closed rollout step did: the share of the step a dedicated
    worker had a request in flight (the median over them, so a preemptible worker that
    joined late in the step does not pull it down), and, when the step borrowed, the mean
    share of the time since the borrow each borrowed worker had one (they were all lent at
    once; one that got nothing counts as 0).  ``None``: not measured."""

    borrowed: bool
    dedicated_busy_share: float | None
    borrowed_busy_share: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.borrowed, bool):
            raise InvalidConfig(f"borrowed must be true or false, got {self.borrowed!r}", key="borrowed")
        for name in ("dedicated_busy_share", "borrowed_busy_share"):
            if getattr(self, name) is not None:
                _share(getattr(self, name), name)

    def to_dict(self) -> dict[str, Any]:
        return {"borrowed": self.borrowed, "dedicated_busy_share": self.dedicated_busy_share,
                "borrowed_busy_share": self.borrowed_busy_share}


def _shares(busy_s: Mapping[int, float], slots: Iterable[int], span_s: float) -> list[float]:
    if not (span_s > 0 and math.isfinite(span_s)):
        return []
    return [min(1.0, max(0.0, busy_s.get(s, 0.0)) / span_s) for s in sorted(set(slots))]


def pool_usage(busy_s: Mapping[int, float], *, span_s: float, dedicated: Iterable[int], borrowed: Iterable[int],
               borrowed_for_s: float | None) -> PoolUsage:
    """``busy_s``: seconds each worker slot had a request in flight during the step (slots
    that did nothing may be missing); ``span_s``: the step's length; ``dedicated`` and
    ``borrowed``: the slots of each zone serving at the step's end; ``borrowed_for_s``:
    how long the borrow lasted (``None``: the step did not borrow)."""
    dedicated_shares = _shares(busy_s, dedicated, span_s)
    lent = _shares(busy_s, borrowed, min(borrowed_for_s, span_s)) if borrowed_for_s is not None else []
    return PoolUsage(borrowed=borrowed_for_s is not None,
                     dedicated_busy_share=statistics.median(dedicated_shares) if dedicated_shares else None,
                     borrowed_busy_share=sum(lent) / len(lent) if lent else None)


def usage_guard(decision: GateDecision, usage: PoolUsage | None, thresholds: UsageThresholds) -> GateDecision:
    """``decision`` unless it borrows against what the last step measured (module docstring)."""
    if not decision.borrow or usage is None:
        return decision
    if usage.borrowed:
        share, floor = usage.borrowed_busy_share, thresholds.min_borrowed_busy_share
        what = "the borrowed workers were busy {:.0%} of the time they were lent"
    else:
        share, floor = usage.dedicated_busy_share, thresholds.min_dedicated_busy_share
        what = "the dedicated workers were busy {:.0%} of the last step (unborrowed)"
    if share is None or share >= floor:
        return decision
    why = f"{what.format(share)} (< {floor:.0%}): the step waits on trajectories, not on workers"
    return replace(decision, borrow=False, overruled=why, reason=f"not borrowing: {why}; {decision.reason}")
