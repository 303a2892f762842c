"""Benefit-aware borrowing gate for idle training GPUs (paper section 4.6, equation 7).

Borrow the overlap zone only when the rollout time it saves on the trajectories still
to finish exceeds what activation plus return cost::

    (R / B) * (T_ded - T_full) > T_toggle

``T_ded`` and ``T_full`` are the best predicted makespans with the dedicated workers
alone and with every overlap worker added (``decision.best_makespan``).  ``T_toggle``
comes from ``ToggleCostEstimator``: exponential moving averages of the model's error
(observed minus predicted step time) over steps with and without borrowing.  Their
difference is the time borrowing adds that the makespan model does not see, i.e. the
handoff cost; subtracting the no-borrow residual cancels the model's own bias.  Until
both kinds of step have been seen, the configured initial estimate is used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pearl_sglang.core.decision import best_makespan, enumerate_candidates
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.makespan import Constraints
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.tail import TurnSpread, predict


# The configured first estimate of ``T_toggle`` (``gate.toggle_cost_s``) when none is given.
INITIAL_TOGGLE_COST_S = 10.0


@dataclass(frozen=True)
class GateDecision:
    borrow: bool
    benefit_s: float
    toggle_cost_s: float
    t_ded_s: float
    t_full_s: float
    reason: str
    # Why a borrow equation (7) made was refused by what the workers did (``core.pool_usage``).
    overruled: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"borrow": self.borrow, "benefit_s": self.benefit_s, "toggle_cost_s": self.toggle_cost_s,
                "t_ded_s": self.t_ded_s, "t_full_s": self.t_full_s, "reason": self.reason,
                "overruled": self.overruled}


def borrow_gate(*, remaining: float, batch: float, t_ded_s: float, t_full_s: float,
                toggle_cost_s: float) -> GateDecision:
    """Equation (7)."""
    if batch <= 0 or not 0 <= remaining <= batch:
        raise InvalidConfig(f"need 0 <= remaining <= batch and batch > 0, got R={remaining}, B={batch}", key="R")
    if toggle_cost_s < 0 or math.isnan(toggle_cost_s):
        raise InvalidConfig(f"toggle cost must be >= 0, got {toggle_cost_s}", key="T_toggle")
    saved = t_ded_s - t_full_s
    benefit = 0.0 if remaining == 0 else (remaining / batch) * saved
    borrow = benefit > toggle_cost_s
    verb = ">" if borrow else "<="
    return GateDecision(borrow, benefit, toggle_cost_s, t_ded_s, t_full_s,
                        f"(R/B)(T_ded - T_full) = ({remaining:g}/{batch:g})({t_ded_s:.4g} - {t_full_s:.4g}) = "
                        f"{benefit:.4g} s {verb} T_toggle = {toggle_cost_s:.4g} s")


def gate_for_profile(profile: Profile, *, dedicated_workers: int, overlap_workers: int, remaining: float,
                     toggle_cost_s: float, constraints: Constraints = Constraints()) -> GateDecision:
    """Equation (7) with ``T_ded`` and ``T_full`` predicted from the profile."""
    t_ded = best_makespan(profile, dedicated_workers, constraints)
    t_full = best_makespan(profile, dedicated_workers + overlap_workers, constraints)
    return borrow_gate(remaining=remaining, batch=profile.B, t_ded_s=t_ded, t_full_s=t_full,
                       toggle_cost_s=toggle_cost_s)


@dataclass(frozen=True)
class ToggleCostEstimator:
    """Online ``T_toggle``; ``observe`` returns a new estimator (no hidden state)."""

    initial_s: float
    alpha: float = 0.3
    residual_with_s: float | None = None
    residual_without_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise InvalidConfig(f"alpha must be in (0, 1], got {self.alpha}", key="alpha")
        if not (self.initial_s >= 0 and math.isfinite(self.initial_s)):
            raise InvalidConfig(f"initial toggle cost must be >= 0, got {self.initial_s}", key="initial_s")

    def observe(self, *, borrowed: bool, observed_s: float, predicted_s: float) -> "ToggleCostEstimator":
        """Fold in one finished step: its measured duration and the model's prediction
        for the configuration it actually ran."""
        residual = observed_s - predicted_s
        if not math.isfinite(residual):
            raise InvalidConfig("step times must be finite", key="observed_s")
        field = "residual_with_s" if borrowed else "residual_without_s"
        old = getattr(self, field)
        new = residual if old is None else self.alpha * residual + (1 - self.alpha) * old
        return replace(self, **{field: new})

    @property
    def estimate_s(self) -> float:
        if self.residual_with_s is None or self.residual_without_s is None:
            return self.initial_s
        return max(0.0, self.residual_with_s - self.residual_without_s)


def tail_gate(profile: Profile, *, dedicated_workers: int, overlap_workers: int, remaining: tuple[float, ...],
              spread: TurnSpread, toggle_cost_s: float, constraints: Constraints = Constraints()) -> GateDecision:
    """Equation (7) with the saving measured directly on the remaining work by the
    tail-aware model: ``T_ded(rest) - T_full(rest) > T_toggle``.  No ``R / B`` scaling is
    needed (the predictions are already of what is left).

    Borrowed workers join mid-step and take the next turns of trajectories whose own
    worker is busy, while a trajectory whose worker has room stays with its prefix cache.
    Which of the two the slowest trajectory is depends on the dedicated pool:

    * tail-bound (its latency floor above its throughput-bound time): its workers have
      room, the slowest trajectory's turns wait on the environment, not on a worker, and
      borrowing does not lower the floor: ``T_full`` keeps the dedicated pool's floor and
      only the throughput-bound part shrinks.  Measured: in the environment-bound regime
      the 8 borrowed workers of a step served 1-10 requests each against ~300 on each
      dedicated worker, and the rollout took as long as without them.
    * throughput-bound: its workers are busy, the borrowed ones take turns off them, and
      every trajectory's turns run at the larger pool's batch: ``T_full`` is the full
      pool's own prediction, floor included.  Measured: in the paper's regime (8 reserved
      GPUs, batch 32) the dedicated pool's floor was predicted at 447 s of the 451 s
      throughput-bound time left, and the rollout with borrowed workers ended 325 s after
      the decision (381 s without them); keeping the dedicated floor made the gate refuse
      a borrow that paid 13% of the step."""
    if dedicated_workers < 1:
        t_ded, floor, keep_floor = math.inf, 0.0, True
    else:
        ded = [predict(profile, c.topology, remaining=remaining, spread=spread, constraints=constraints)
               for c in enumerate_candidates(profile, dedicated_workers, constraints) if c.feasible]
        best = min(ded, key=lambda pr: pr.makespan_s)
        t_ded, floor, keep_floor = best.makespan_s, best.floor_s, best.tail_bound
    full = dedicated_workers + overlap_workers
    t_full = math.inf
    if full >= 1:
        for c in enumerate_candidates(profile, full, constraints):
            if c.feasible:
                pr = predict(profile, c.topology, remaining=remaining, spread=spread, constraints=constraints)
                t_full = min(t_full, max(pr.throughput_s, floor) if keep_floor else pr.makespan_s)
    n = float(max(len(remaining), 1))
    return borrow_gate(remaining=n if remaining else 0.0, batch=n, t_ded_s=t_ded, t_full_s=t_full,
                       toggle_cost_s=toggle_cost_s)
