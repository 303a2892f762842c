"""What a driver run reports: per turn, per trajectory, per step.

``TurnTelemetry`` holds what a deployment can observe about one inference call
(SGLang's ``meta_info`` counts plus the environment time); ``to_turn_records`` turns
those into the core's ``TurnRecord`` for profile fitting.  ``StepResult`` carries the
paper's throughput metric (section 6.1): rollout-generated plus training tokens over
the step's duration.  All times are emulated seconds from the driver's ``EmulatedTime``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from pearl_sglang.core.telemetry import TurnRecord


@dataclass(frozen=True)
class TurnTelemetry:
    trajectory_id: str
    step: int
    turn_index: int
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    env_time_s: float
    request_s: float
    attempts: int
    # The policy that generated this turn: the version the trainer had pushed when it was
    # sent, and the one the worker reported (None if it did not). Carried-over
    # trajectories mix versions across their turns; the trainer can weight or filter them.
    policy_version: str = ""
    weight_version: str | None = None

    @property
    def computed_prompt_tokens(self) -> int:
        """Prompt tokens the engine had to prefill (not served from its prefix cache)."""
        return max(0, self.prompt_tokens - self.cached_tokens)


def to_turn_records(turns: Iterable[TurnTelemetry]) -> tuple[TurnRecord, ...]:
    """Core records whose ``delta_L`` sums to the effective prefill work.

    ``fit_step`` adds each non-final turn's ``carried_tokens`` back, so a turn's
    ``new_input_tokens`` is its computed prefill minus the previous response; the sum
    over a trajectory is then exactly its computed prefill.  ``decode_time_s`` is the
    request's latency, which also holds its prefill and queueing (an upper bound).
    """
    out: list[TurnRecord] = []
    prev: dict[str, int] = {}
    for t in sorted(turns, key=lambda t: (t.trajectory_id, t.turn_index)):
        new_input = max(0, t.computed_prompt_tokens - prev.get(t.trajectory_id, 0))
        out.append(TurnRecord(trajectory_id=t.trajectory_id, turn_index=t.turn_index,
                              new_input_tokens=new_input, carried_tokens=t.generated_tokens,
                              generated_tokens=t.generated_tokens, env_time_s=t.env_time_s,
                              decode_time_s=t.request_s, request_s=t.request_s))
        prev[t.trajectory_id] = t.generated_tokens
    return tuple(out)


@dataclass(frozen=True)
class Trajectory:
    """One finished (or failed) trajectory; ``tokens`` is what training consumes."""

    index: int
    trajectory_id: str
    group: int
    step: int
    tokens: int
    generated_tokens: int
    turns: int
    start: float
    end: float
    errors: tuple[str, ...]
    failed: bool
    telemetry: tuple[TurnTelemetry, ...]
    started_step: int | None = None  # the step it began in, when carried over (else ``step``)

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def policy_versions(self) -> tuple[str, ...]:
        """The distinct policy versions of its turns, oldest first."""
        return tuple(dict.fromkeys(t.policy_version for t in self.telemetry))


@dataclass(frozen=True)
class StepResult:
    """One training step.  ``start``/``end`` bound the pipeline period: from the previous
    step's weight push (or the run's start) to this step's, so durations add up to the
    run and throughput is not double-counted while rollout overlaps training."""

    step: int
    start: float
    end: float
    rollout_start: float
    rollout_end: float
    train_start: float
    train_end: float
    weight_version: str
    rollout_generated_tokens: int
    training_tokens: int
    trajectories: int
    failed_trajectories: int
    turns: int
    errors: int
    error_samples: tuple[str, ...]
    mean_trajectory_s: float
    max_trajectory_s: float
    telemetry: tuple[TurnTelemetry, ...]
    # Partial-rollout carry-over: trajectories resumed from the previous step (they are
    # among ``trajectories``), and those left unfinished at this step's cut (trained later).
    carried_in: tuple[str, ...] = ()
    carried_out: tuple[str, ...] = ()
    # Tokens the carried-out trajectories generated in their completed turns (trained later).
    carried_out_generated_tokens: int = 0
    trajectory_ids: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def throughput(self) -> float:
        """(rollout generated + training tokens) per emulated second."""
        d = self.duration_s
        return (self.rollout_generated_tokens + self.training_tokens) / d if d > 0 else 0.0
