"""Runtime Tracker: fit the workload symbols from per-request telemetry (section 5).

After each rollout step the shell hands over what a deployment can observe; this module
turns it into ``S, r, delta_L, theta, A, b, t_prefill`` (and ``T_env``) and smooths the
estimates across steps with an exponential moving average, because adjacent steps are
similar but the workload drifts.  It never sees an emulator's constants, only records:

* ``TurnRecord``: one inference call of one trajectory.  ``new_input_tokens`` are the
  prompt tokens the engine had to compute that did not come from this trajectory's
  previous response (observation, rewritten context; i.e. ``prompt_tokens -
  cached_tokens`` minus the carried response when the engine reports cache hits);
  ``carried_tokens`` are the tokens of this turn's response kept in the next prompt.
* ``DecodeSample``: one worker's decode iteration time at a concurrency, e.g. running
  requests divided by generation throughput from ``/v1/loads``.
* ``PrefillSample``: prefill tokens computed by one worker and the time it took.

Estimators (per step):

* ``S``: the most turns of any trajectory (the slowest trajectory is the one with the
  most turns; turn count dominates its duration and needs no clock).
* ``r``: generated tokens per turn.
* ``delta_L``: (new input + response carried from the previous turn) per turn, i.e. the
  growth ``p_{k+1} = p_k + r_k + o_k`` of section 2.1 as prefill work.
* ``theta``: environment time over decode time, summed over turns; this is
  ``(1 - f) / f`` with ``f`` the fraction of a trajectory's life spent decoding.
* ``T_env``: ``S`` times the mean environment time per turn.
* ``A``, ``b``: least squares of iteration time against concurrency; needs two
  distinct concurrencies, otherwise the step leaves them unchanged.
* ``t_prefill``: total prefill seconds over total prefill tokens (weights long
  prefills more, matching how they dominate the makespan).

The last three are the engine's rates, and under a contended colocated batch these
estimators are biased (measured on an emulated Qwen3-8B pool whose true rates are known,
cache-friendly workload, batch 32 on two workers plus eight borrowed): a turn's time to
its first chunk includes its wait behind other prefills, so ``t_prefill`` came out 4-30x
the engine's per-token cost, rising with the worker's concurrency at dispatch; and the
iteration time per token was flat (27-29 ms) over dispatch concurrencies 4-15 where the
engine's rises 19-29 ms, so ``b`` came out a quarter of the engine's and ``A`` twice.
``fitted_symbols`` with ``ProfileFit.WORKLOAD`` keeps the configured rates (measured
offline, e.g. by ``benchmarks.calibrate``) and refits only the workload's symbols.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Iterable

from pearl_sglang.core.errors import InvalidConfig, InvalidProfile
from pearl_sglang.core.profile import Profile


@dataclass(frozen=True)
class TurnRecord:
    trajectory_id: str
    turn_index: int
    new_input_tokens: int
    carried_tokens: int
    generated_tokens: int
    env_time_s: float
    decode_time_s: float


@dataclass(frozen=True)
class DecodeSample:
    concurrency: float
    iteration_s: float


@dataclass(frozen=True)
class PrefillSample:
    tokens: int
    seconds: float


@dataclass(frozen=True)
class StepTelemetry:
    turns: tuple[TurnRecord, ...]
    decode: tuple[DecodeSample, ...] = ()
    prefill: tuple[PrefillSample, ...] = ()

    def scaled(self, k: float) -> "StepTelemetry":
        """Durations multiplied by ``k``: telemetry measured on a clock running ``k`` times
        slower than the workload (an emulator's time scale), in the workload's seconds."""
        if k == 1.0:
            return self
        return StepTelemetry(
            turns=tuple(replace(t, env_time_s=t.env_time_s * k, decode_time_s=t.decode_time_s * k)
                        for t in self.turns),
            decode=tuple(replace(d, iteration_s=d.iteration_s * k) for d in self.decode),
            prefill=tuple(replace(p, seconds=p.seconds * k) for p in self.prefill))


@dataclass(frozen=True)
class WorkloadEstimate:
    """Fitted symbols; ``None`` where the telemetry could not identify them."""

    S: float | None = None
    r: float | None = None
    delta_L: float | None = None
    theta: float | None = None
    T_env: float | None = None
    A: float | None = None
    b: float | None = None
    t_prefill: float | None = None


class ProfileFit(str, Enum):
    """Which symbols telemetry refits: ``all`` (the paper's Runtime Tracker) or
    ``workload`` (``S, r, delta_L, theta, T_env``; the engine's rates stay configured)."""

    ALL = "all"
    WORKLOAD = "workload"


ENGINE_RATES = frozenset({"A", "b", "t_prefill"})


def fitted_symbols(est: WorkloadEstimate, fit: ProfileFit = ProfileFit.ALL) -> dict[str, float]:
    """The symbols telemetry has identified that ``fit`` lets replace the configured ones."""
    return {f.name: value for f in fields(est) if (value := getattr(est, f.name)) is not None
            and (fit is ProfileFit.ALL or f.name not in ENGINE_RATES)}


@dataclass(frozen=True)
class StaticFacts:
    """What the deployment knows without measuring: batch, model and hardware."""

    B: float
    K: float
    BW: float
    K_seq: float
    H_max: float
    T_over: float = 0.0


def _fit_line(samples: Iterable[DecodeSample]) -> tuple[float | None, float | None]:
    pts = [(s.concurrency, s.iteration_s) for s in samples]
    if len({x for x, _ in pts}) < 2:
        return None, None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return max(0.0, my - slope * mx), max(0.0, slope)


def fit_step(step: StepTelemetry) -> WorkloadEstimate:
    """Estimate the symbols from one step (see the module docstring)."""
    turns = step.turns
    est = WorkloadEstimate()
    if turns:
        per_traj: dict[str, list[TurnRecord]] = {}
        for t in turns:
            per_traj.setdefault(t.trajectory_id, []).append(t)
        last = {tid: max(ts, key=lambda t: t.turn_index).turn_index for tid, ts in per_traj.items()}
        n = len(turns)
        s = max(len(ts) for ts in per_traj.values())
        carried = sum(t.carried_tokens for t in turns if t.turn_index != last[t.trajectory_id])
        decode = sum(t.decode_time_s for t in turns)
        env = sum(t.env_time_s for t in turns)
        est = replace(
            est,
            S=float(s),
            r=sum(t.generated_tokens for t in turns) / n,
            delta_L=(sum(t.new_input_tokens for t in turns) + carried) / n,
            theta=env / decode if decode > 0 else None,
            T_env=s * env / n,
        )
    a, b = _fit_line(step.decode)
    tokens = sum(p.tokens for p in step.prefill)
    return replace(est, A=a, b=b, t_prefill=sum(p.seconds for p in step.prefill) / tokens if tokens > 0 else None)


@dataclass(frozen=True)
class ProfileTracker:
    """EMA of per-step estimates; ``observe`` returns a new tracker."""

    alpha: float = 0.3
    estimate: WorkloadEstimate = WorkloadEstimate()
    steps: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise InvalidConfig(f"alpha must be in (0, 1], got {self.alpha}", key="alpha")

    def observe(self, step: StepTelemetry) -> "ProfileTracker":
        new = fit_step(step)
        merged = {}
        for f in fields(WorkloadEstimate):
            old, cur = getattr(self.estimate, f.name), getattr(new, f.name)
            if cur is None or not math.isfinite(cur):
                merged[f.name] = old
            elif old is None:
                merged[f.name] = cur
            else:
                merged[f.name] = self.alpha * cur + (1 - self.alpha) * old
        return replace(self, estimate=WorkloadEstimate(**merged), steps=self.steps + 1)

    def profile(self, facts: StaticFacts) -> Profile:
        """The decision engine's input; raises ``InvalidProfile`` naming any symbol the
        telemetry has not yet identified."""
        values = {}
        for f in fields(WorkloadEstimate):
            value = getattr(self.estimate, f.name)
            if value is None:
                raise InvalidProfile(f"{f.name} not yet observed in telemetry", key=f.name)
            values[f.name] = value
        return Profile(B=facts.B, K=facts.K, BW=facts.BW, K_seq=facts.K_seq, H_max=facts.H_max,
                       T_over=facts.T_over, **values)
