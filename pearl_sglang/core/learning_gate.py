"""A borrowing gate that learns its toggle cost, by exploring a little.

Equation (7) borrows when the predicted saving on the remaining work exceeds
``T_toggle``.  ``ToggleCostEstimator`` learns ``T_toggle`` as the difference between
the model's error on borrowed and on unborrowed steps, and the error on unborrowed steps
is the model's own bias.  A gate that borrows every step never sees an unborrowed one,
so neither the bias nor the cost is ever learned: the configured guess stays forever.

Two ways give the estimator that second kind of observation:

* a counterfactual: estimate from a borrowed step's own telemetry how long it would
  have taken without the overlap workers.  That estimate *is* the makespan model, the
  thing whose bias we want to measure, so it would learn its own assumptions back.
* exploration: now and then run a step unborrowed and measure it.  It costs real time,
  but only the predicted benefit of that step, and only when that benefit is small.

We explore, bounded two ways (``Exploration``): at most ``rate`` of the gate's calls
(counted deterministically, no random state, so a replay is reproducible and the bound
holds at every prefix), and only when the decision is close: the predicted benefit is
within ``max_benefit_ratio`` times the current cost estimate, either way.  A gate that
would borrow on such a benefit runs the step unborrowed; a gate that would refuse it
borrows (the mirror problem: a gate that never borrows never learns the cost either).
A step where borrowing clearly pays is never given up, and borrowing is never tried when
the benefit is far below the cost.  ``rate = 0`` is equation (7) with the learned cost.
Exploration also stops once both kinds of step have been seen ``min_observations``
times, unless ``keep_exploring`` (the workload drifts; a little exploration keeps the
estimate current).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import GateDecision, ToggleCostEstimator


@dataclass(frozen=True)
class Exploration:
    rate: float = 0.1
    max_benefit_ratio: float = 2.0
    min_observations: int = 3
    keep_exploring: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not 0 <= self.rate <= 1:
            raise InvalidConfig(f"exploration rate must be in [0, 1], got {self.rate!r}", key="rate")
        if not (isinstance(self.max_benefit_ratio, (int, float)) and math.isfinite(self.max_benefit_ratio)
                and self.max_benefit_ratio >= 1):
            raise InvalidConfig(f"max_benefit_ratio must be >= 1, got {self.max_benefit_ratio!r}",
                                key="max_benefit_ratio")
        if isinstance(self.min_observations, bool) or not isinstance(self.min_observations, int) \
                or self.min_observations < 1:
            raise InvalidConfig(f"min_observations must be an integer >= 1, got {self.min_observations!r}",
                                key="min_observations")


@dataclass(frozen=True)
class GateChoice:
    """What the learning gate did, with the equation-(7) answer it started from."""

    borrow: bool
    explored: bool
    gate: GateDecision
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.gate.to_dict(), "borrow": self.borrow, "explored": self.explored,
                "reason": self.reason}


@dataclass(frozen=True)
class LearningGate:
    """Pure state: ``choose`` and ``observe`` return new gates."""

    estimator: ToggleCostEstimator
    exploration: Exploration = Exploration()
    calls: int = 0
    explored: int = 0
    seen_with: int = 0
    seen_without: int = 0

    @property
    def toggle_cost_s(self) -> float:
        return self.estimator.estimate_s

    @property
    def bias_s(self) -> float:
        """Observed minus predicted step time when not borrowing (0 until seen)."""
        return self.estimator.residual_without_s or 0.0

    @property
    def learned(self) -> bool:
        return self.seen_with > 0 and self.seen_without > 0

    def _wants_observations(self) -> bool:
        enough = min(self.seen_with, self.seen_without) >= self.exploration.min_observations
        return self.exploration.keep_exploring or not enough

    def choose(self, gate: GateDecision) -> tuple["LearningGate", GateChoice]:
        """Follow equation (7), except for a bounded exploration step (module docstring).

        ``gate`` must have been computed with this gate's ``toggle_cost_s``."""
        calls = self.calls + 1
        ratio, cost = self.exploration.max_benefit_ratio, self.toggle_cost_s
        if gate.borrow:
            close = gate.benefit_s <= ratio * cost
        else:
            close = gate.benefit_s > 0 and gate.benefit_s * ratio >= cost
        budget = self.explored + 1 <= self.exploration.rate * calls
        explore = close and budget and self._wants_observations()
        nxt = replace(self, calls=calls, explored=self.explored + int(explore))
        if not explore:
            return nxt, GateChoice(gate.borrow, False, gate, gate.reason)
        what = "not borrowing to measure an unborrowed step" if gate.borrow else "borrowing to measure a borrowed step"
        why = (f"explore: {what}; predicted benefit {gate.benefit_s:.4g} s is within {ratio:g}x of "
               f"T_toggle ({cost:.4g} s); {nxt.explored}/{calls} steps explored; {gate.reason}")
        return nxt, GateChoice(not gate.borrow, True, gate, why)

    def observe(self, *, borrowed: bool, observed_s: float, predicted_s: float) -> "LearningGate":
        """Fold in one finished step: its duration and the prediction for what ran."""
        return replace(self, estimator=self.estimator.observe(borrowed=borrowed, observed_s=observed_s,
                                                             predicted_s=predicted_s),
                       seen_with=self.seen_with + int(borrowed), seen_without=self.seen_without + int(not borrowed))

    def describe(self) -> dict[str, Any]:
        return {"toggle_cost_s": self.toggle_cost_s, "bias_s": self.bias_s, "learned": self.learned,
                "calls": self.calls, "explored": self.explored, "seen_with": self.seen_with,
                "seen_without": self.seen_without, "exploration_rate": self.exploration.rate}
