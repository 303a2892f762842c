"""Per-mode correction of the makespan model, learned from the steps that ran.

The makespan model's error is not the same in both modes.  Measured on the two-hour
Qwen3-8B replays (swe-paper, segment 2): colocated steps took 0.80-1.00x the paper
model's prediction, disaggregated steps 1.00-1.22x.  A 15% mode threshold cannot absorb
an error that differs by 20-40% between the modes: the model predicted 3P3D 15.7% faster
than 6C, the pool switched, and every PD step was slower than the colocated step before.

``ModeCorrection`` keeps an EWMA of ``observed / predicted`` per mode, and one over all
steps.  Candidates are scaled by their mode's factor before the decision compares them.
After one step in each mode the comparison uses what each mode actually delivered.
Ratios (P:D splits) share their mode's factor, so the correction never changes a ratio
decision.

Until both modes have run, the factors carry a prior: disaggregated candidates are
scaled by ``pd_prior`` relative to colocated ones (a mode never run gets the overall
factor, times or divided by the prior).  Without it the first switch on a knife edge
always happened, and one PD step was the price of learning that the model overrates PD:
the elastic replays switched at predicted gains of 15.4% and (on earlier code) 15.7%
against the 15% mode threshold and ran slower each time.  The default, 1.08, is
measured on the fixed-resource sweep, not on those replays: at the seven points where
the model's best P:D split was within 10% of colocation, that split's observed/predicted
over colocation's was 1.03-1.30 (median 1.08), and colocation was faster at all seven.
``pd_prior: 1.0`` restores the neutral start.

A step is attributed to the mode of the last prediction made for it (a switch
mid-step charges its relaunch to the mode it switched to, which is conservative).
Pure: the orchestrator feeds it finished steps and applies it to candidates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.makespan import Candidate
from pearl_sglang.core.topology import Mode


@dataclass(frozen=True)
class ModeFeedback:
    """Configuration.  ``alpha``: weight of the newest step in the EWMA (one step in a
    mode is enough to act on: a PD step costs minutes).  ``min_ratio``/``max_ratio``:
    one step's observed/predicted is clipped to this range (a step cut short by a
    failure, or stretched by a stall, must not swing the decision on its own).
    ``pd_prior``: disaggregated over colocated factor until both modes have run."""

    enabled: bool = True
    alpha: float = 0.5
    min_ratio: float = 0.5
    max_ratio: float = 2.0
    pd_prior: float = 1.08

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise InvalidConfig(f"mode_feedback enabled must be true or false, got {self.enabled!r}", key="enabled")
        for name in ("alpha", "min_ratio", "max_ratio", "pd_prior"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidConfig(f"mode_feedback {name} must be a number, got {value!r}", key=name)
        if not 0 < self.alpha <= 1:
            raise InvalidConfig(f"mode_feedback alpha must be in (0, 1], got {self.alpha!r}", key="alpha")
        if not 0 < self.min_ratio <= 1 <= self.max_ratio:
            raise InvalidConfig("mode_feedback needs 0 < min_ratio <= 1 <= max_ratio, got "
                                f"{self.min_ratio!r}, {self.max_ratio!r}", key="min_ratio")
        if not self.min_ratio <= self.pd_prior <= self.max_ratio:
            raise InvalidConfig(f"mode_feedback pd_prior must be in [min_ratio, max_ratio], got {self.pd_prior!r}",
                                key="pd_prior")


@dataclass(frozen=True)
class ModeCorrection:
    """Pure state: ``observe`` returns a new correction."""

    config: ModeFeedback = ModeFeedback()
    by_mode: Mapping[Mode, float] = field(default_factory=dict)
    steps: Mapping[Mode, int] = field(default_factory=dict)
    overall: float | None = None

    @classmethod
    def from_factors(cls, factors: Mapping[Mode, float], config: ModeFeedback = ModeFeedback()) -> "ModeCorrection":
        """Given factors (what ``/pearl/state`` shows); a mode left out gets their mean,
        with the PD prior."""
        overall = sum(factors.values()) / len(factors) if factors else None
        return cls(config, by_mode=dict(factors), overall=overall)

    def factor(self, mode: Mode | None) -> float:
        """Observed over predicted for ``mode``: its own EWMA; else the overall one (1
        before any step) with the PD prior, so that PD stands ``pd_prior`` above colocation."""
        if not self.config.enabled:
            return 1.0
        if mode in self.by_mode:
            return self.by_mode[mode]
        base = 1.0 if self.overall is None else self.overall
        if mode is Mode.DISAGGREGATED:
            return base * self.config.pd_prior
        return base / self.config.pd_prior if Mode.DISAGGREGATED in self.by_mode else base

    def observe(self, mode: Mode | None, *, observed_s: float, predicted_s: float) -> "ModeCorrection":
        """Fold in one finished step that ran in ``mode`` (ignored when either time is
        not a positive number or the mode is unknown)."""
        if mode is None or not (observed_s > 0 and predicted_s > 0) \
                or not math.isfinite(observed_s) or not math.isfinite(predicted_s):
            return self
        c = self.config
        ratio = min(max(observed_s / predicted_s, c.min_ratio), c.max_ratio)

        def ewma(old: float | None) -> float:
            return ratio if old is None else (1 - c.alpha) * old + c.alpha * ratio

        return replace(self, by_mode={**self.by_mode, mode: ewma(self.by_mode.get(mode))},
                       steps={**self.steps, mode: self.steps.get(mode, 0) + 1}, overall=ewma(self.overall))

    def apply(self, candidates: Iterable[Candidate]) -> tuple[Candidate, ...]:
        """Each candidate's predictions scaled by its mode's factor (feasibility unchanged)."""
        out = []
        for cand in candidates:
            f = self.factor(cand.topology.mode)
            out.append(cand if f == 1.0 else replace(
                cand, predicted_makespan_s=cand.predicted_makespan_s * f,
                prefill_path_s=cand.prefill_path_s * f, decode_path_s=cand.decode_path_s * f))
        return tuple(out)

    def describe(self) -> dict[str, Any]:
        return {"enabled": self.config.enabled, "alpha": self.config.alpha, "pd_prior": self.config.pd_prior,
                "overall": self.overall,
                "by_mode": {m.value: {"factor": f, "steps": self.steps.get(m, 0)} for m, f in self.by_mode.items()}}
