"""Routing policies: which of the filtered workers takes a request (like sglang-router's
``select_worker`` / ``select_worker_pair``).

Every policy sees the same typed candidates (worker, its load, the prefix it holds, when
it was last assigned, how many prefix blocks it holds) and returns one of them; policies
never see HTTP or the state table. Three are built in:

* ``cost`` (default): the estimated time of the request on each worker from the runtime
  profile (``core.placement``): prefix-aware prefill, queued prefill, the decode
  concurrency it would join including trajectories between turns. Ties: least recently
  assigned.
* ``cache_aware``: sglang-router 0.3.2's rule, for comparison. If the load is imbalanced
  (busiest - idlest > ``balance_abs`` requests and busiest > ``balance_rel`` x idlest),
  the least loaded worker; else, if the best prefix match covers more than
  ``cache_threshold`` of the request, the worker with that match; else the worker that
  holds the fewest prefix blocks (the smallest tree). Defaults as sglang-router's.
* ``round_robin``: the next worker in slot order after the previous choice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, Sequence

from pearl_sglang.core.placement import CostRates, Option, choose_colocated, choose_pair
from pearl_sglang.core.state import WorkerRecord


class PolicyName(str, Enum):
    COST = "cost"
    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"


POLICY_NAMES = tuple(p.value for p in PolicyName)


@dataclass(frozen=True)
class Candidate:
    worker: WorkerRecord
    option: Option
    tree_blocks: int = 0


@dataclass(frozen=True)
class Request:
    key: tuple[int, ...]
    context_tokens: int
    holder: int | None
    rates: CostRates


class RoutingPolicy(Protocol):
    name: str

    def select_worker(self, candidates: Sequence[Candidate], request: Request) -> Candidate: ...

    def select_pair(self, prefills: Sequence[Candidate], decodes: Sequence[Candidate],
                    request: Request) -> tuple[Candidate, Candidate]: ...


def _by_slot(candidates: Sequence[Candidate], option: Option) -> Candidate:
    return next(c for c in candidates if c.option.slot == option.slot)


@dataclass(frozen=True)
class CostPolicy:
    """``margin_s``: how much cheaper another worker must be before a trajectory leaves the
    worker that holds its prefix (no hopping between near-equal workers)."""

    margin_s: float = 0.05
    name: str = PolicyName.COST.value

    def select_worker(self, candidates: Sequence[Candidate], request: Request) -> Candidate:
        chosen = choose_colocated(request.rates, [c.option for c in candidates],
                                  context_tokens=request.context_tokens, margin_s=self.margin_s,
                                  holder=request.holder)
        return _by_slot(candidates, chosen)

    def select_pair(self, prefills: Sequence[Candidate], decodes: Sequence[Candidate],
                    request: Request) -> tuple[Candidate, Candidate]:
        p, d = choose_pair(request.rates, [c.option for c in prefills], [c.option for c in decodes],
                           context_tokens=request.context_tokens, margin_s=self.margin_s,
                           holder=request.holder)
        return _by_slot(prefills, p), _by_slot(decodes, d)


def _running(c: Candidate) -> int:
    return c.option.load.running


@dataclass(frozen=True)
class CacheAwarePolicy:
    cache_threshold: float = 0.3
    balance_abs: int = 64
    balance_rel: float = 1.5
    name: str = PolicyName.CACHE_AWARE.value

    def select_worker(self, candidates: Sequence[Candidate], request: Request) -> Candidate:
        least = min(candidates, key=lambda c: (_running(c), c.option.slot))
        busiest = max(_running(c) for c in candidates)
        lowest = _running(least)
        if busiest - lowest > self.balance_abs and busiest > self.balance_rel * lowest:
            return least
        best = max(candidates, key=lambda c: (c.option.matched_tokens, -c.option.slot))
        total = max(request.context_tokens, 1)
        if best.option.matched_tokens / total > self.cache_threshold:
            return best
        return min(candidates, key=lambda c: (c.tree_blocks, c.option.slot))

    def select_pair(self, prefills: Sequence[Candidate], decodes: Sequence[Candidate],
                    request: Request) -> tuple[Candidate, Candidate]:
        return self.select_worker(prefills, request), min(decodes, key=lambda c: (_running(c), c.option.slot))


@dataclass
class RoundRobinPolicy:
    """Its state is the previous choice per pool (explicit, not hidden in a counter)."""

    last: dict[str, int] = field(default_factory=dict)
    name: str = PolicyName.ROUND_ROBIN.value

    def _next(self, pool: str, candidates: Sequence[Candidate]) -> Candidate:
        ordered = sorted(candidates, key=lambda c: c.option.slot)
        prev = self.last.get(pool, -1)
        chosen = next((c for c in ordered if c.option.slot > prev), ordered[0])
        self.last[pool] = chosen.option.slot
        return chosen

    def select_worker(self, candidates: Sequence[Candidate], request: Request) -> Candidate:
        return self._next("worker", candidates)

    def select_pair(self, prefills: Sequence[Candidate], decodes: Sequence[Candidate],
                    request: Request) -> tuple[Candidate, Candidate]:
        return self._next("prefill", prefills), self._next("decode", decodes)


def make_policy(name: str) -> RoutingPolicy:
    if name == PolicyName.COST.value:
        return CostPolicy()
    if name == PolicyName.CACHE_AWARE.value:
        return CacheAwarePolicy()
    if name == PolicyName.ROUND_ROBIN.value:
        return RoundRobinPolicy()
    raise ValueError(f"routing policy must be one of {POLICY_NAMES}, got {name!r}")
