"""Critical-path estimate: how long each running trajectory still has to go.

A rollout step ends when its slowest trajectory ends, so the router ranks running
trajectories by their expected remaining time and names the top share the step's predicted
stragglers. Purely computational: the router's telemetry collector supplies the progress
snapshots (turns done, tokens so far, time since the trajectory's first request) and the
workload history (the last finished step), and the caller passes ``now`` implicitly through
``elapsed_s``.

Model. A trajectory's total turn count ``N`` is drawn from the workload's empirical
distribution (the previous step's trajectories); having done ``k`` turns it still has
``E[N - k | N > k]`` turns to go, or one more turn when the history has none that long (a
running trajectory is not known to be done). A client that knows how many turns a
trajectory will take (``X-Pearl-Expected-Turns``, e.g. the task's turns in an earlier
epoch) replaces the distribution: ``expected - k`` turns remain while ``k < expected``;
past it, the distribution answers again. Each remaining turn costs what this trajectory's
turns have cost so far (decode and environment time, from ``elapsed_s / k``), blended with
the workload's mean turn time as a prior worth one turn, and generates as many tokens as its
turns have on average.

Invariants (checked by property tests):
* every estimate is finite and non-negative, and remaining turns are at least one;
* with a history where every trajectory had ``N`` turns and ``k < N``, ``N - k`` turns remain;
* with an expected turn count ``E > k``, ``E - k`` turns remain whatever the history;
* the stragglers are the ``ceil(share * n)`` largest estimates, in descending order, and no
  trajectory left out is expected to finish later than one named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.telemetry import StepTelemetry


@dataclass(frozen=True)
class TrajectoryProgress:
    trajectory_id: str
    turns_done: int
    tokens_so_far: int
    elapsed_s: float
    expected_turns: int | None = None  # the client's hint of its total turns


@dataclass(frozen=True)
class WorkloadHistory:
    """What finished trajectories looked like: their turn counts and mean turn time."""

    turn_counts: tuple[int, ...] = ()
    mean_turn_s: float | None = None

    @classmethod
    def from_step(cls, step: StepTelemetry) -> "WorkloadHistory":
        per: dict[str, int] = {}
        for t in step.turns:
            per[t.trajectory_id] = per.get(t.trajectory_id, 0) + 1
        n = len(step.turns)
        total = sum(t.decode_time_s + t.env_time_s for t in step.turns)
        return cls(turn_counts=tuple(sorted(per.values())), mean_turn_s=total / n if n else None)


@dataclass(frozen=True)
class RemainingEstimate:
    trajectory_id: str
    turns_done: int
    elapsed_s: float
    remaining_turns: float
    remaining_tokens: float
    remaining_s: float
    expected_turns: int | None = None  # the client's hint, when it sent one

    def to_dict(self) -> dict:
        return {"trajectory": self.trajectory_id, "turns_done": self.turns_done,
                "expected_turns": self.expected_turns, "elapsed_s": round(self.elapsed_s, 6),
                "remaining_turns": round(self.remaining_turns, 6), "remaining_tokens": round(self.remaining_tokens, 3),
                "remaining_s": round(self.remaining_s, 6)}


def expected_remaining_turns(turns_done: int, turn_counts: Iterable[int]) -> float:
    longer = [n for n in turn_counts if n > turns_done]
    if not longer:
        return 1.0
    return sum(longer) / len(longer) - turns_done


def estimate(progress: TrajectoryProgress, history: WorkloadHistory) -> RemainingEstimate:
    k = max(0, progress.turns_done)
    elapsed = max(0.0, progress.elapsed_s)
    hint = progress.expected_turns
    turns = float(hint - k) if hint is not None and hint > k else expected_remaining_turns(k, history.turn_counts)
    prior = history.mean_turn_s if history.mean_turn_s is not None and history.mean_turn_s >= 0 else None
    if k > 0 and prior is not None:
        per_turn = (elapsed + prior) / (k + 1)
    elif k > 0:
        per_turn = elapsed / k
    else:
        per_turn = prior if prior is not None else elapsed
    tokens_per_turn = progress.tokens_so_far / k if k > 0 else 0.0
    return RemainingEstimate(trajectory_id=progress.trajectory_id, turns_done=k, elapsed_s=elapsed,
                             remaining_turns=turns, remaining_tokens=turns * max(0.0, tokens_per_turn),
                             remaining_s=turns * per_turn, expected_turns=hint)


def predicted_stragglers(progress: Iterable[TrajectoryProgress], history: WorkloadHistory, *,
                         share: float) -> tuple[RemainingEstimate, ...]:
    """The ``ceil(share * n)`` running trajectories expected to finish last, latest first
    (ties broken by trajectory id so the answer does not depend on input order)."""
    if not 0 < share <= 1:
        raise InvalidConfig(f"straggler share must be in (0, 1], got {share}", key="straggler_share")
    ests = sorted((estimate(p, history) for p in progress),
                  key=lambda e: (-e.remaining_s, e.trajectory_id))
    return tuple(ests[:math.ceil(share * len(ests))])
