"""Tail-aware makespan: the step cannot end before its slowest trajectory does.

The paper's equations (``makespan``) assume work-conserving, throughput-bound rollout:
adding workers always shortens the step.  When the environment dominates, or a few
trajectories run many more turns than the rest, the step is bound instead by the
latency of the trajectories still running, which no extra worker shortens.  This module
adds that floor and predicts::

    T = max(T_paper(remaining work), T_floor)

For one trajectory with ``k`` turns left, a turn costs its environment time plus its
decode at the worker's batch, ``r * (A + b * c)`` with ``c`` the sequences decoding
concurrently on one decode worker (live trajectories per decode worker times the
decoding fraction ``1 / (1 + theta)``).  Turns are treated as independent draws, so the
trajectory needs ``k * mean + z * sqrt(k) * std`` with ``mean`` and ``std`` the per-turn
latency's mean and standard deviation (environment and decode spreads added in
quadrature) and ``z`` how far into the tail to look (``DEFAULT_Z``).  The floor is
the largest of these over the running trajectories.

``T_paper(remaining work)`` is today's model on what is left: ``B`` becomes the number
of running trajectories, ``S`` the most turns any of them has left and ``T_env`` shrinks
in proportion, so a decision taken mid-step (borrow, join, leave) weighs the work that
remains, not a fresh batch.  With a fresh batch (every trajectory has ``S`` turns left)
and no spread the floor never exceeds the paper's model, so decisions only change where
the tail dominates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable

from pearl_sglang.core.decision import enumerate_candidates
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.makespan import Candidate, Constraints, evaluate
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.telemetry import StepTelemetry
from pearl_sglang.core.topology import Mode, Topology

# How far above the mean the slowest running trajectory lies, in per-turn standard
# deviations times sqrt(turns left); it stacks on ``S``, the most turns any trajectory
# had.  2.0 is fitted by ``python -m benchmarks.tail_floor_fit`` on the stragglers
# ablation's replays (swe-paper, batch 64, 8 and 16 GPUs colocated; not the
# decision-quality grid): predicting each step's slowest trajectory from the previous
# step's turn statistics, z = 2.0 has a bias of +0.8% and a MAPE of 4.4% over 16 steps
# (z = 1.5: -2.8% and 4.8%; z = 2.5: +4.5% and 5.3%; z = 0, the most-turns trajectory
# at the mean turn time: -13.7%).  It is close to the expected largest of 32-64 standard
# normal draws (2.0-2.4).
DEFAULT_Z = 2.0


def _nonneg(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidConfig(f"{name} must be a finite number >= 0, got {value!r}", key=name)


@dataclass(frozen=True)
class TurnSpread:
    """Per-turn environment time and generated tokens: mean and standard deviation.

    The means duplicate what ``Profile`` holds as totals (``T_env / S`` and ``r``); the
    spreads are what the paper's model has no place for.
    """

    env_mean_s: float
    env_std_s: float = 0.0
    tokens_mean: float = 0.0
    tokens_std: float = 0.0
    z: float = DEFAULT_Z

    def __post_init__(self) -> None:
        for name in ("env_mean_s", "env_std_s", "tokens_mean", "tokens_std", "z"):
            _nonneg(getattr(self, name), name)

    def to_dict(self) -> dict[str, float]:
        return {"env_mean_s": self.env_mean_s, "env_std_s": self.env_std_s, "tokens_mean": self.tokens_mean,
                "tokens_std": self.tokens_std, "z": self.z}

    @classmethod
    def of_profile(cls, p: Profile, *, z: float = DEFAULT_Z) -> "TurnSpread":
        """No spread: the means the profile already implies."""
        return cls(env_mean_s=p.T_env / p.S, tokens_mean=p.r, z=z)


def _mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def spread_of(step: StepTelemetry, *, z: float = DEFAULT_Z) -> TurnSpread | None:
    """Fit ``TurnSpread`` from one step's turn records; ``None`` without turns."""
    if not step.turns:
        return None
    env_mean, env_std = _mean_std([t.env_time_s for t in step.turns])
    tok_mean, tok_std = _mean_std([float(t.generated_tokens) for t in step.turns])
    return TurnSpread(env_mean, env_std, tok_mean, tok_std, z)


def fresh_batch(p: Profile) -> tuple[float, ...]:
    """Remaining turns at the start of a step: every trajectory has ``S`` ahead."""
    return (p.S,) * max(1, int(round(p.B)))


def remaining_turns(turns_done: Iterable[int], expected_turns: float) -> tuple[float, ...]:
    """Turns left for each running trajectory, given how many it has finished and the
    turns a trajectory runs (``S``); a trajectory past ``S`` still has at least one."""
    _nonneg(expected_turns, "expected_turns")
    return tuple(max(1.0, expected_turns - done) for done in turns_done)


def decode_concurrency(p: Profile, topology: Topology, running: int) -> float:
    """Sequences one decode worker runs at once while ``running`` trajectories live."""
    workers = topology.colocated if topology.mode is Mode.COLOCATED else topology.decode
    return running / (max(1, workers) * (1.0 + p.theta))


def trajectory_latency(turns_left: float, mean_s: float, std_s: float, z: float = DEFAULT_Z) -> float:
    """What one trajectory with ``turns_left`` turns still needs, each turn an independent
    draw of mean ``mean_s`` and standard deviation ``std_s``, ``z`` deviations into the tail."""
    return turns_left * mean_s + z * math.sqrt(turns_left) * std_s


def latency_floor(p: Profile, topology: Topology, remaining: tuple[float, ...], spread: TurnSpread) -> float:
    """Longest time any running trajectory still needs (module docstring)."""
    if not remaining:
        return 0.0
    for k in remaining:
        _nonneg(k, "remaining_turns")
    iteration = p.A + p.b * decode_concurrency(p, topology, len(remaining))
    mean = spread.env_mean_s + spread.tokens_mean * iteration
    std = math.hypot(spread.env_std_s, spread.tokens_std * iteration)
    return max(trajectory_latency(k, mean, std, spread.z) for k in remaining)


def remaining_profile(p: Profile, remaining: tuple[float, ...]) -> Profile | None:
    """The profile of what is left: ``B`` running, ``S`` most turns left; ``None`` when
    nothing runs."""
    if not remaining or max(remaining) <= 0:
        return None
    s_left = max(remaining)
    return replace(p, B=float(len(remaining)), S=s_left, T_env=p.T_env * s_left / p.S)


@dataclass(frozen=True)
class TailPrediction:
    throughput_s: float
    floor_s: float

    @property
    def makespan_s(self) -> float:
        return max(self.throughput_s, self.floor_s)

    @property
    def tail_bound(self) -> bool:
        return self.floor_s > self.throughput_s

    def to_dict(self) -> dict[str, Any]:
        return {"makespan_s": self.makespan_s, "throughput_s": self.throughput_s, "floor_s": self.floor_s,
                "tail_bound": self.tail_bound}


def predict(p: Profile, topology: Topology, *, remaining: tuple[float, ...] | None = None,
            spread: TurnSpread | None = None, constraints: Constraints = Constraints()) -> TailPrediction:
    """``max(T_paper(remaining work), T_floor)`` for one topology; a fresh batch and the
    profile's own means when ``remaining`` and ``spread`` are not given."""
    remaining = fresh_batch(p) if remaining is None else tuple(remaining)
    spread = TurnSpread.of_profile(p) if spread is None else spread
    left = remaining_profile(p, remaining)
    if left is None:
        return TailPrediction(0.0, 0.0)
    throughput = evaluate(left, topology, constraints).predicted_makespan_s
    return TailPrediction(throughput, latency_floor(p, topology, remaining, spread))


def tail_candidates(p: Profile, budget: int, *, remaining: tuple[float, ...] | None = None,
                    spread: TurnSpread | None = None,
                    constraints: Constraints = Constraints()) -> tuple[Candidate, ...]:
    """The decision engine's candidates at ``budget`` with the tail-aware prediction
    (``predict``) in place of the paper's; feasibility (KV, prefill stability) is the
    paper's, judged on the full batch."""
    return tuple(replace(c, predicted_makespan_s=predict(p, c.topology, remaining=remaining, spread=spread,
                                                         constraints=constraints).makespan_s)
                 for c in enumerate_candidates(p, budget, constraints))
