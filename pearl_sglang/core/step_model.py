"""Which makespan model the control plane decides with, and what each predicts for the
step in progress.  Pure: the orchestrator hands in the profile, the turn spread of the
last step and the turns each running trajectory has done (router telemetry).

``paper`` is the paper's equations, as the engine always used them: a decision predicts
the whole batch on the chosen topology, and the borrowing gate scales the saving by
``R / B``.  ``tail`` is ``tail.predict``: the step ends when both the throughput-bound
work and the slowest running trajectory are done, evaluated on the work that remains
(a fresh batch at a step's start; the turns left of each trajectory mid-step).

The step prediction each model records for the configuration that ran is what the
replays compare with the measured rollout time:

* paper: the last decision's whole-batch makespan (the model has no notion of the work
  already done, so this is what it believes the step takes);
* tail: time already spent in the step plus the prediction of the remaining work.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from pearl_sglang.core.decision import enumerate_candidates
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import GateDecision, gate_for_profile, tail_gate
from pearl_sglang.core.makespan import Candidate, Constraints, evaluate
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.tail import TurnSpread, predict, remaining_turns, tail_candidates
from pearl_sglang.core.topology import Topology


class MakespanModel(str, Enum):
    PAPER = "paper"
    TAIL = "tail"

    @classmethod
    def parse(cls, value: object) -> "MakespanModel":
        try:
            return cls(value)
        except ValueError:
            raise InvalidConfig(f"makespan_model must be one of {', '.join(m.value for m in cls)}, got {value!r}",
                                key="makespan_model") from None


@dataclass(frozen=True)
class StepContext:
    """Where the step stands when a decision is taken.

    ``remaining``: turns left per running trajectory, ``None`` at a step's start (a fresh
    batch); ``spread``: per-turn spread of the last step (``None``: the profile's means,
    no spread); ``elapsed_s``: time the step has run so far."""

    remaining: tuple[float, ...] | None = None
    spread: TurnSpread | None = None
    elapsed_s: float = 0.0


def running_turns(turns_done: Iterable[int], batch: float, expected_turns: float) -> tuple[float, ...]:
    """Turns left of each trajectory of a step of ``batch``: the ones telemetry has seen
    have done ``turns_done``, the rest none yet.  A finished trajectory cannot be told
    from a running one, so it counts as running (the floor only looks at the largest)."""
    done = list(turns_done)[: max(0, int(round(batch)))]
    done += [0] * max(0, int(round(batch)) - len(done))
    return remaining_turns(done, expected_turns)


def candidates(model: MakespanModel, p: Profile, budget: int, ctx: StepContext,
               constraints: Constraints = Constraints()) -> tuple[Candidate, ...]:
    """The candidates ``decision.decide`` compares at ``budget`` under ``model``."""
    if model is MakespanModel.PAPER:
        return enumerate_candidates(p, budget, constraints)
    return tail_candidates(p, budget, remaining=ctx.remaining, spread=ctx.spread, constraints=constraints)


def step_predictions(p: Profile, topology: Topology, ctx: StepContext,
                     constraints: Constraints = Constraints()) -> dict[str, float]:
    """Both models' prediction of the step's duration on ``topology`` (module docstring)."""
    paper = evaluate(p, topology, constraints).predicted_makespan_s
    tail = ctx.elapsed_s + predict(p, topology, remaining=ctx.remaining, spread=ctx.spread,
                                   constraints=constraints).makespan_s
    return {MakespanModel.PAPER.value: paper, MakespanModel.TAIL.value: tail}


def gate(model: MakespanModel, p: Profile, *, dedicated_workers: int, overlap_workers: int, remaining: float,
         ctx: StepContext, toggle_cost_s: float, constraints: Constraints = Constraints()) -> GateDecision:
    """Equation (7) under ``model``: the paper's ``(R / B)(T_ded - T_full)`` on the whole
    batch, or the tail-aware saving on the work that remains (``gate.tail_gate``)."""
    if model is MakespanModel.PAPER:
        return gate_for_profile(p, dedicated_workers=dedicated_workers, overlap_workers=overlap_workers,
                                remaining=remaining, toggle_cost_s=toggle_cost_s, constraints=constraints)
    count = max(0, round(remaining))
    if ctx.remaining is None:
        left = (float(p.S),) * count
    else:  # the ``remaining`` trajectories with the most turns left are the ones still running
        left = tuple(sorted(ctx.remaining, reverse=True)[:count])
    spread = ctx.spread if ctx.spread is not None else TurnSpread.of_profile(p)
    return tail_gate(p, dedicated_workers=dedicated_workers, overlap_workers=overlap_workers, remaining=left,
                     spread=spread, toggle_cost_s=toggle_cost_s, constraints=constraints)
