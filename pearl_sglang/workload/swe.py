"""An emulated SWE-style agentic workload: what each trajectory of a rollout step does.

The driver needs trajectories that look like SWE-bench agents (long initial prompt,
many turns, short responses, long-tailed environment latency) without a model or a
sandbox.  This module is purely computational: given a seed and a global trajectory
index it returns the same turns every time, so a demo run, a benchmark and a test can
replay exactly the same workload.  Defaults follow
``shared/reference/workload-and-hardware.md`` (SWE-Gym-like turn counts, ~800 tokens
added per turn, lognormal environment latency with median 1 s and p90 10 s).

``rewrite_fraction`` models why real agents re-prefill far more than their new tokens
(chat templates dropping earlier reasoning, scaffolds truncating observations): before
each new turn, that fraction of the previous prompt (its tail) is replaced by fresh ids,
so a prefix cache only covers the rest.  0 is the cache-friendly regime; ~0.5-0.9 gives
the prefill-heavy regime the paper measured.

Invariants: the sampler never draws from a shared random state (every draw is keyed by
seed, purpose, trajectory and turn); members of one GRPO group (``index //
group_size``) share the initial prompt and nothing else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

from pearl_sglang.core.errors import InvalidConfig

_Z90 = NormalDist().inv_cdf(0.90)

# Purposes that key independent random streams.
_PROMPT, _TURNS, _TURN, _REWRITE, _HINT = 1, 2, 3, 4, 5
_WORD = 1 << 32  # SeedSequence reads an int below this as one 32-bit word


@dataclass(frozen=True)
class SweWorkload:
    """Shape of the workload; token counts are ``(low, high)`` inclusive ranges."""

    batch_size: int = 64
    group_size: int = 16
    turns_median: float = 17.0
    turns_sigma: float = 0.5
    turns_min: int = 3
    turns_max: int = 50
    initial_prompt_tokens: tuple[int, int] = (2000, 4000)
    observation_tokens: tuple[int, int] = (400, 650)
    response_tokens: tuple[int, int] = (150, 400)
    max_trajectory_tokens: int = 32768
    env_latency_median_s: float = 1.0
    env_latency_p90_s: float = 10.0
    env_latency_cut_s: float = 300.0
    rewrite_fraction: float = 0.0
    vocab: tuple[int, int] = (1000, 151000)
    seed: int = 0

    def validate(self) -> None:
        def bad(key: str, why: str) -> InvalidConfig:
            return InvalidConfig(f"{key}: {why}", key=key)

        if self.batch_size < 1 or self.group_size < 1:
            raise bad("batch_size", "batch and group sizes must be positive")
        if self.batch_size % self.group_size:
            raise bad("group_size", f"batch_size {self.batch_size} is not a multiple of {self.group_size}")
        if not 1 <= self.turns_min <= self.turns_max:
            raise bad("turns_min", "need 1 <= turns_min <= turns_max")
        if self.turns_median <= 0 or self.turns_sigma < 0:
            raise bad("turns_median", "turns_median must be positive and turns_sigma >= 0")
        for key in ("initial_prompt_tokens", "observation_tokens", "response_tokens"):
            lo, hi = getattr(self, key)
            if not 1 <= lo <= hi:
                raise bad(key, f"need 1 <= low <= high, got ({lo}, {hi})")
        if self.initial_prompt_tokens[1] + self.response_tokens[1] > self.max_trajectory_tokens:
            raise bad("max_trajectory_tokens", "the longest initial prompt plus the longest "
                      "response must fit in a trajectory")
        if not 0 < self.env_latency_median_s <= self.env_latency_p90_s <= self.env_latency_cut_s:
            raise bad("env_latency_p90_s", "need 0 < median <= p90 <= cut")
        if not 0.0 <= self.rewrite_fraction <= 1.0:
            raise bad("rewrite_fraction", "must be within [0, 1]")
        if not 0 <= self.vocab[0] < self.vocab[1]:
            raise bad("vocab", "need 0 <= low < high (high exclusive)")

    @property
    def env_latency_sigma(self) -> float:
        """Lognormal sigma that puts the p90 where the config says."""
        return math.log(self.env_latency_p90_s / self.env_latency_median_s) / _Z90


@dataclass(frozen=True)
class TurnPlan:
    """What turn ``turn_index`` of a trajectory will do, decided before it runs."""

    turn_index: int
    response_tokens: int
    observation_ids: tuple[int, ...]
    env_latency_s: float


class SweSampler:
    """Deterministic draws for a ``SweWorkload`` (pure: no I/O, no shared RNG state)."""

    def __init__(self, workload: SweWorkload) -> None:
        workload.validate()
        self.workload = workload

    def _rng(self, purpose: int, *key: int) -> np.random.Generator:
        words = (self.workload.seed, purpose, *key)
        if 0 <= min(words) and max(words) < _WORD:  # the list's own seed words, without numpy's loop per int
            return np.random.default_rng(np.array(words, dtype=np.uint32))
        return np.random.default_rng(list(words))

    def _ids(self, rng: np.random.Generator, n: int) -> list[int]:
        lo, hi = self.workload.vocab
        return rng.integers(lo, hi, size=n).tolist()

    def group_of(self, index: int) -> int:
        return index // self.workload.group_size

    def initial_prompt(self, index: int) -> tuple[int, ...]:
        """The task's prompt; every member of a GRPO group gets the same one."""
        rng = self._rng(_PROMPT, self.group_of(index))
        lo, hi = self.workload.initial_prompt_tokens
        return tuple(self._ids(rng, int(rng.integers(lo, hi + 1))))

    def turn_count(self, index: int) -> int:
        """Turns the agent wants; the token budget may end the trajectory earlier."""
        w = self.workload
        x = self._rng(_TURNS, index).lognormal(math.log(w.turns_median), w.turns_sigma)
        return int(min(max(round(x), w.turns_min), w.turns_max))

    def planned_turns(self, index: int) -> int:
        """The turns the trajectory will run: ``turn_count`` cut where the next turn's
        prompt and response no longer fit ``max_trajectory_tokens`` (each response as long
        as planned, as the driver asks with ``ignore_eos``)."""
        context = len(self.initial_prompt(index))
        for k in range(self.turn_count(index)):
            plan = self.turn(index, k)
            if not self.fits(context, plan):
                return max(1, k)
            context += plan.response_tokens + len(plan.observation_ids)
        return self.turn_count(index)

    def turns_hint(self, index: int, sigma: float) -> int:
        """What a client would expect of the trajectory's turns: ``planned_turns`` times a
        lognormal error of ``sigma`` (0: exact), at least 1. Deterministic per index."""
        if sigma < 0:
            raise InvalidConfig(f"hint sigma must be >= 0, got {sigma}", key="turns_hint_sigma")
        error = self._rng(_HINT, index).lognormal(0.0, sigma) if sigma > 0 else 1.0
        return max(1, round(self.planned_turns(index) * error))

    def turn(self, index: int, turn_index: int) -> TurnPlan:
        w = self.workload
        rng = self._rng(_TURN, index, turn_index)
        response = int(rng.integers(w.response_tokens[0], w.response_tokens[1] + 1))
        latency = rng.lognormal(math.log(w.env_latency_median_s), w.env_latency_sigma)
        n_obs = int(rng.integers(w.observation_tokens[0], w.observation_tokens[1] + 1))
        return TurnPlan(turn_index=turn_index, response_tokens=response,
                        observation_ids=tuple(self._ids(rng, n_obs)),
                        env_latency_s=float(min(latency, w.env_latency_cut_s)))

    def rewritten_tokens(self, context_tokens: int) -> int:
        return int(round(self.workload.rewrite_fraction * context_tokens))

    def rewrite(self, context: Sequence[int], index: int, turn_index: int) -> list[int]:
        """``context`` with its last ``rewrite_fraction`` replaced by fresh ids.

        The length is unchanged: a rewrite changes tokens (so they must be prefilled
        again), it does not shorten the trajectory.
        """
        k = self.rewritten_tokens(len(context))
        head = list(context[:len(context) - k])
        if k == 0:
            return head
        return head + self._fresh(index, turn_index, k).tolist()

    def _fresh(self, index: int, turn_index: int, k: int) -> np.ndarray:
        lo, hi = self.workload.vocab
        return self._rng(_REWRITE, index, turn_index).integers(lo, hi, size=k)

    def next_context(self, prompt: Sequence[int], output: Sequence[int], plan: TurnPlan,
                     index: int) -> list[int]:
        """``p_{k+1} = rewrite(p_k) + r_k + o_k`` (section 2.1 plus the rewrite)."""
        return self.rewrite(prompt, index, plan.turn_index) + list(output) + list(plan.observation_ids)

    def next_context_array(self, prompt: np.ndarray, output: Sequence[int], plan: TurnPlan,
                           index: int) -> np.ndarray:
        """``next_context`` as an int64 array.  A trajectory keeps its context as one, so a
        turn never turns tens of thousands of token ids into Python ints and back (the
        JSON encoder writes arrays as they are)."""
        k = self.rewritten_tokens(len(prompt))
        parts = [prompt[:len(prompt) - k]]
        if k:
            parts.append(self._fresh(index, plan.turn_index, k))
        parts += [np.asarray(output, dtype=np.int64), np.asarray(plan.observation_ids, dtype=np.int64)]
        return np.concatenate(parts)

    def fits(self, context_tokens: int, plan: TurnPlan) -> bool:
        """Whether a turn with this prompt length stays within the trajectory budget."""
        return context_tokens + plan.response_tokens <= self.workload.max_trajectory_tokens
