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
* ``A``, ``b``: least squares of the time per generated token on the batch's mean
  sequences and context tokens over the turn's decode, with the prefill tokens the
  worker ran meanwhile as a nuisance term (``_fit_decode``); ``b`` is one more sequence
  of the mean context seen.  Needs two distinct concurrencies, otherwise the step leaves
  them unchanged.
* ``t_prefill``: the median seconds per token of the turns' waits for their first chunk
  over their computed tokens plus the prefill tokens finished ahead of them
  (``_prefill_rate``).

The last three are the engine's rates.  Fitted as the paper's tracker does (iteration
time against the concurrency when the turn was sent; time to the first chunk over the
turn's own tokens) they were badly biased under a contended colocated batch (measured on
an emulated Qwen3-8B pool whose rates are known, cache-friendly workload, batch 32 on
two workers plus eight borrowed): ``t_prefill`` 4-30x the engine's cost, rising with the
queue in front of the turn; ``b`` a quarter of the engine's and ``A`` twice, because the
count at dispatch is not the batch the turn decoded in and late, long turns decode
beside few others while early, short ones crowd.  The router now measures what the
worker did during each window (``router.activity``); on the same pool the fit is within
2% of the engine's ``A``, +20% of its ``b`` at the mean context and +12% of its
calibrated ``t_prefill`` (the paper's regime: +2%, +15%, -51%; the emulator streams its
first chunk after ``stream_interval`` tokens, so the prefill wait is what is left of
64 decode iterations, the noisiest of the three).  ``fitted_symbols`` with ``ProfileFit.WORKLOAD`` still keeps
the configured rates (measured offline, e.g. by ``benchmarks.calibrate``) and refits
only the workload's symbols.
"""
from __future__ import annotations

import math
import statistics
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
    # Arrival to last token (queue, prefill and decode); 0: not measured.
    request_s: float = 0.0


@dataclass(frozen=True)
class DecodeSample:
    """Time per generated token in a batch of mean ``concurrency`` sequences over mean
    ``context_tokens`` (0: not observed), with the prefill tokens the worker ran between
    those tokens (per token), which stretched them."""

    concurrency: float
    iteration_s: float
    context_tokens: float = 0.0
    prefill_tokens_per_token: float = 0.0


@dataclass(frozen=True)
class PrefillSample:
    tokens: int
    seconds: float


@dataclass(frozen=True)
class StepTelemetry:
    """One rollout step's records.  ``worker_busy_s``: seconds each worker slot had a
    request in flight, over the step's ``span_s`` (for ``core.pool_usage``; the fit does
    not read them)."""

    turns: tuple[TurnRecord, ...]
    decode: tuple[DecodeSample, ...] = ()
    prefill: tuple[PrefillSample, ...] = ()
    worker_busy_s: tuple[tuple[int, float], ...] = ()
    span_s: float = 0.0

    def scaled(self, k: float) -> "StepTelemetry":
        """Durations multiplied by ``k``: telemetry measured on a clock running ``k`` times
        slower than the workload (an emulator's time scale), in the workload's seconds."""
        if k == 1.0:
            return self
        return StepTelemetry(
            turns=tuple(replace(t, env_time_s=t.env_time_s * k, decode_time_s=t.decode_time_s * k,
                                 request_s=t.request_s * k)
                        for t in self.turns),
            decode=tuple(replace(d, iteration_s=d.iteration_s * k) for d in self.decode),
            prefill=tuple(replace(p, seconds=p.seconds * k) for p in self.prefill),
            worker_busy_s=tuple((slot, busy * k) for slot, busy in self.worker_busy_s),
            span_s=self.span_s * k)


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


def _least_squares(rows: list[tuple[float, ...]], ys: list[float]) -> tuple[float, ...] | None:
    """Ordinary least squares with an intercept: ``(intercept, *slopes)``, or None when
    the regressors do not vary independently (a singular system)."""
    n, k = len(rows), len(rows[0]) + 1
    xs = [(1.0, *r) for r in rows]
    mat = [[sum(x[i] * x[j] for x in xs) for j in range(k)] + [sum(x[i] * y for x, y in zip(xs, ys))]
           for i in range(k)]
    for col in range(k):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, k), key=lambda r: abs(mat[r][col]))
        if abs(mat[pivot][col]) <= 1e-12 * max(1.0, max(abs(v) for v in mat[col][:k])) * n:
            return None
        mat[col], mat[pivot] = mat[pivot], mat[col]
        for r in range(k):
            if r != col:
                f = mat[r][col] / mat[col][col]
                mat[r] = [a - f * b for a, b in zip(mat[r], mat[col])]
    return tuple(mat[i][k] / mat[i][i] for i in range(k))


def _fit_decode(samples: Iterable[DecodeSample]) -> tuple[float | None, float | None]:
    """``A`` and ``b`` by least squares of the iteration time on the batch's sequences
    ``c``, its context tokens and the prefill tokens run between its tokens (a nuisance
    term: prefills take priority and stretch the decode they interrupt)::

        iteration = A + b_seq * c + b_ctx * context + t * prefill_per_token

    ``b`` is the cost of one more sequence of the mean context seen, ``b_seq + b_ctx *
    context / c`` (an iteration's cost grows with the tokens it attends over, and late
    turns are long and run beside fewer others).  A term whose regressor does not vary
    (no context observed, no prefill on a PD decode worker) is left out."""
    samples = list(samples)
    if len({s.concurrency for s in samples}) < 2:
        return None, None
    ys = [s.iteration_s for s in samples]
    term_sets = ((True, True), (True, False), (False, True), (False, False))
    if not all(s.context_tokens > 0 for s in samples):
        term_sets = term_sets[2:]
    for use_ctx, use_prefill in term_sets:
        rows = [(s.concurrency,) + ((s.context_tokens,) if use_ctx else ())
                + ((s.prefill_tokens_per_token,) if use_prefill else ()) for s in samples]
        fit = _least_squares(rows, ys)
        if fit is None:
            continue
        a, b = fit[0], fit[1]
        if use_ctx:
            b += fit[2] * sum(s.context_tokens for s in samples) / sum(s.concurrency for s in samples)
        return max(0.0, a), max(0.0, b)
    return None, None


# Below this many tokens a prefill's fixed costs (a scheduler pass, the iteration it waits
# for) dominate its time per token.
MIN_PREFILL_TOKENS = 256


def _prefill_rate(samples: Iterable[PrefillSample]) -> float | None:
    """The median of seconds per token over the samples of at least ``MIN_PREFILL_TOKENS``
    (all of them when none is that long).  Not the ratio of the sums: a turn's wait for its
    first chunk can also hold a wait for KV memory or a worker's other work, and those few
    long waits would dominate a sum (measured on the cache-friendly pool of the module
    docstring: the ratio of sums 2.7x the calibrated rate with the queue counted, the
    median +12%)."""
    samples = [p for p in samples if p.tokens > 0]
    long = [p for p in samples if p.tokens >= MIN_PREFILL_TOKENS] or samples
    if not long:
        return None
    return statistics.median(p.seconds / p.tokens for p in long)


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
    a, b = _fit_decode(step.decode)
    return replace(est, A=a, b=b, t_prefill=_prefill_rate(step.prefill))


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
