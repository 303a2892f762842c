"""PD decision engine with mode-dependent hysteresis (paper section 4.3.2).

Pure function from (profile, budget, current topology, thresholds) to a ``Decision``;
the hysteresis state is the current topology the caller passes in, nothing is hidden.

Procedure: enumerate colocation with ``N`` workers and every split ``N_P`` in
``[1, N - 1]``, ``N_D = N - N_P``; drop infeasible candidates (``makespan``); take the
best; compare it with the *incumbent*, the current topology carried to this budget.

* The incumbent is the current topology when its counts add up to ``N``; after a budget
  change it is the feasible candidate of the current mode nearest to the current counts
  (fewest workers added, removed or re-roled; ties to the lower makespan), so growing
  or shrinking keeps the mode and ratio unless a switch pays for itself.
* A switch is admitted only when it lowers the predicted makespan by more than a
  relative threshold: ``thresholds.mode`` for colocation <-> disaggregation,
  ``thresholds.ratio`` for a new P:D split.  When the best candidate is in the other
  mode but misses the mode threshold, the best same-mode candidate may still win on the
  ratio threshold.
* Forced: when there is no feasible incumbent (the last prefill worker left, the KV
  cache no longer fits) the best feasible candidate is taken without hysteresis.

Invariants (tested as properties): the choice is always feasible; under a constant
profile and budget, feeding the choice back as ``current`` never switches again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.makespan import Candidate, Constraints, evaluate
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.topology import Topology


@dataclass(frozen=True)
class Thresholds:
    """Relative makespan improvements a switch must exceed (0.05 = 5% faster).

    A ratio change costs a role switch of a few workers (``/pd_role_switch``, CUDA graph
    recapture); a mode change relaunches every worker, hence the larger default.
    """

    ratio: float = 0.05
    mode: float = 0.15

    def __post_init__(self) -> None:
        for name in ("ratio", "mode"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise InvalidConfig(f"threshold {name} must be in [0, 1), got {value!r}", key=name)
        if self.mode < self.ratio:
            raise InvalidConfig("threshold mode must be >= threshold ratio", key="mode")


class Reason(str, Enum):
    INITIAL = "initial"
    FORCED = "forced"
    SWITCH_MODE = "switch_mode"
    SWITCH_RATIO = "switch_ratio"
    HOLD = "hold"


@dataclass(frozen=True)
class Decision:
    choice: Topology
    switch: bool
    forced: bool
    reason_code: Reason
    reason: str
    incumbent: Topology | None
    candidates: tuple[Candidate, ...]

    def candidate(self, topology: Topology) -> Candidate:
        for c in self.candidates:
            if c.topology == topology:
                return c
        raise KeyError(topology.label())

    @property
    def predicted_makespan_s(self) -> float:
        return self.candidate(self.choice).predicted_makespan_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "choice": self.choice.to_dict(),
            "switch": self.switch,
            "forced": self.forced,
            "reason_code": self.reason_code.value,
            "reason": self.reason,
            "incumbent": self.incumbent.to_dict() if self.incumbent else None,
            "predicted_makespan_s": self.predicted_makespan_s,
            "candidates": [c.to_dict() for c in self.candidates],
        }


def enumerate_candidates(p: Profile, budget: int, constraints: Constraints = Constraints()) -> tuple[Candidate, ...]:
    """Colocation first, then ``N_P = 1 .. N - 1``."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InvalidConfig(f"budget N must be an integer >= 1, got {budget!r}", key="N")
    topologies = [Topology.coloc(budget)] + [Topology.pd(n_p, budget - n_p) for n_p in range(1, budget)]
    return tuple(evaluate(p, t, constraints) for t in topologies)


def _best(cands: list[Candidate], prefer: Topology | None) -> Candidate:
    # Ties go to the incumbent (no needless switch), then to enumeration order.
    return min(cands, key=lambda c: (c.predicted_makespan_s, c.topology != prefer))


def _distance(a: Topology, b: Topology) -> int:
    return abs(a.prefill - b.prefill) + abs(a.decode - b.decode) + abs(a.colocated - b.colocated)


def _incumbent(current: Topology, budget: int, feasible: list[Candidate]) -> Candidate | None:
    if not current.is_valid:
        return None
    if current.total == budget:
        return next((c for c in feasible if c.topology == current), None)
    same_mode = [c for c in feasible if c.topology.mode is current.mode]
    if not same_mode:
        return None
    return min(same_mode, key=lambda c: (_distance(c.topology, current), c.predicted_makespan_s))


def _improvement(incumbent: Candidate, other: Candidate) -> float:
    base = incumbent.predicted_makespan_s
    if base <= 0 or not math.isfinite(base):
        return 0.0
    return (base - other.predicted_makespan_s) / base


def _why_infeasible(current: Topology, budget: int, cands: tuple[Candidate, ...]) -> str:
    if not current.is_valid:
        return f"current topology {current.label()} is not a valid PD or colocated shape"
    match = next((c for c in cands if c.topology == current), None)
    if match is not None and match.violations:
        return f"current topology {current.label()} violates {'; '.join(match.violations)}"
    return f"no feasible {current.mode.value if current.mode else ''} topology near {current.label()} at N={budget}"


def decide(
    profile: Profile,
    *,
    budget: int,
    current: Topology | None = None,
    thresholds: Thresholds = Thresholds(),
    constraints: Constraints = Constraints(),
    candidates: tuple[Candidate, ...] | None = None,
) -> Decision:
    """``candidates``: the budget's candidates predicted by another makespan model (the
    tail-aware one, ``tail.tail_candidates``); by default the paper's equations."""
    cands = enumerate_candidates(profile, budget, constraints) if candidates is None else candidates
    feasible = [c for c in cands if c.feasible]
    # Colocation with N >= 1 is always feasible, so ``feasible`` is never empty.
    best = _best(feasible, prefer=None)

    def done(choice: Candidate, *, switch: bool, forced: bool, code: Reason, why: str, inc: Candidate | None) -> Decision:
        if inc is not None and current is not None and inc.topology != current and choice is inc:
            why = f"resize {current.label()} -> {inc.topology.label()} for N={budget}; {why}"
        return Decision(choice.topology, switch, forced, code, why, inc.topology if inc else None, cands)

    if current is None:
        return done(best, switch=True, forced=False, code=Reason.INITIAL,
                    why=f"no current topology; best predicted is {best.topology.label()} "
                        f"({best.predicted_makespan_s:.4g} s)", inc=None)
    inc = _incumbent(current, budget, feasible)
    if inc is None:
        return done(best, switch=True, forced=True, code=Reason.FORCED,
                    why=f"forced: {_why_infeasible(current, budget, cands)}; "
                        f"switching to best feasible {best.topology.label()} ({best.predicted_makespan_s:.4g} s)",
                    inc=None)
    best = _best(feasible, prefer=inc.topology)
    if best.topology == inc.topology:
        return done(inc, switch=False, forced=False, code=Reason.HOLD,
                    why=f"hold: {inc.topology.label()} is already the best prediction "
                        f"({inc.predicted_makespan_s:.4g} s)", inc=inc)
    gain = _improvement(inc, best)
    if best.topology.mode is not inc.topology.mode:
        if gain > thresholds.mode:
            return done(best, switch=True, forced=False, code=Reason.SWITCH_MODE,
                        why=f"mode switch {inc.topology.label()} -> {best.topology.label()}: "
                            f"{gain:.2%} lower makespan > mode threshold {thresholds.mode:.2%}", inc=inc)
        same = _best([c for c in feasible if c.topology.mode is inc.topology.mode], prefer=inc.topology)
        same_gain = _improvement(inc, same)
        if same.topology != inc.topology and same_gain > thresholds.ratio:
            return done(same, switch=True, forced=False, code=Reason.SWITCH_RATIO,
                        why=f"ratio change {inc.topology.label()} -> {same.topology.label()}: "
                            f"{same_gain:.2%} lower makespan > ratio threshold {thresholds.ratio:.2%}; "
                            f"mode switch to {best.topology.label()} gains only {gain:.2%} "
                            f"<= mode threshold {thresholds.mode:.2%}", inc=inc)
        return done(inc, switch=False, forced=False, code=Reason.HOLD,
                    why=f"hold {inc.topology.label()}: best {best.topology.label()} gains {gain:.2%} "
                        f"<= mode threshold {thresholds.mode:.2%}", inc=inc)
    if gain > thresholds.ratio:
        return done(best, switch=True, forced=False, code=Reason.SWITCH_RATIO,
                    why=f"ratio change {inc.topology.label()} -> {best.topology.label()}: "
                        f"{gain:.2%} lower makespan > ratio threshold {thresholds.ratio:.2%}", inc=inc)
    return done(inc, switch=False, forced=False, code=Reason.HOLD,
                why=f"hold {inc.topology.label()}: best {best.topology.label()} gains {gain:.2%} "
                    f"<= ratio threshold {thresholds.ratio:.2%}", inc=inc)


def best_makespan(profile: Profile, budget: int, constraints: Constraints = Constraints()) -> float:
    """Lowest predicted makespan at a budget; ``inf`` for no workers (used by the gate)."""
    if budget < 1:
        return math.inf
    return min(c.predicted_makespan_s for c in enumerate_candidates(profile, budget, constraints) if c.feasible)
