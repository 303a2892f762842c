"""Routing policies: which of the filtered workers takes a request (like sglang-router's
``select_worker`` / ``select_worker_pair``).

Every policy sees the same typed options (``core.placement.Option``: the worker's slot, its
load, the prefix it holds, when it was last assigned, how many prefix blocks it holds)
and returns the index of one; policies never see HTTP or the state table. Three are built in:

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
from typing import NamedTuple, Protocol, Sequence

from pearl_sglang.core.placement import CostRates, Option, choose_colocated, choose_pair


class PolicyName(str, Enum):
    COST = "cost"
    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"


POLICY_NAMES = tuple(p.value for p in PolicyName)


class Request(NamedTuple):
    """``home``: the worker the request's trajectory lives on (``Selector.home``), if any."""

    key: tuple[int, ...]
    context_tokens: int
    home: int | None
    rates: CostRates


class RoutingPolicy(Protocol):
    """Policies return indexes into the options they are given."""

    name: str

    def select_worker(self, options: Sequence[Option], request: Request) -> int: ...

    def select_pair(self, prefills: Sequence[Option], decodes: Sequence[Option],
                    request: Request) -> tuple[int, int]: ...


@dataclass(frozen=True)
class CostPolicy:
    """``margin``: how much cheaper (relative) another worker must be before a trajectory
    leaves its home, the worker of its previous turn (no hopping between near-equal
    workers). A request without a home (a first turn) gets no margin: the cheapest wins."""

    margin: float = 0.05
    name: str = PolicyName.COST.value

    def select_worker(self, options: Sequence[Option], request: Request) -> int:
        return choose_colocated(request.rates, options, context_tokens=request.context_tokens,
                                margin=self.margin, holder=request.home)

    def select_pair(self, prefills: Sequence[Option], decodes: Sequence[Option],
                    request: Request) -> tuple[int, int]:
        return choose_pair(request.rates, prefills, decodes, context_tokens=request.context_tokens,
                           margin=self.margin, holder=request.home)


def _least_running(options: Sequence[Option]) -> int:
    return min(range(len(options)), key=lambda i: (options[i].load.running, options[i].slot))


@dataclass(frozen=True)
class CacheAwarePolicy:
    cache_threshold: float = 0.3
    balance_abs: int = 64
    balance_rel: float = 1.5
    name: str = PolicyName.CACHE_AWARE.value

    def select_worker(self, options: Sequence[Option], request: Request) -> int:
        least = _least_running(options)
        busiest = max(o.load.running for o in options)
        lowest = options[least].load.running
        if busiest - lowest > self.balance_abs and busiest > self.balance_rel * lowest:
            return least
        best = max(range(len(options)), key=lambda i: (options[i].matched_tokens, -options[i].slot))
        if options[best].matched_tokens / max(request.context_tokens, 1) > self.cache_threshold:
            return best
        return min(range(len(options)), key=lambda i: (options[i].cached_blocks, options[i].slot))

    def select_pair(self, prefills: Sequence[Option], decodes: Sequence[Option],
                    request: Request) -> tuple[int, int]:
        return self.select_worker(prefills, request), _least_running(decodes)


@dataclass
class RoundRobinPolicy:
    """Its state is the previous choice per pool (explicit, not hidden in a counter)."""

    last: dict[str, int] = field(default_factory=dict)
    name: str = PolicyName.ROUND_ROBIN.value

    def _next(self, pool: str, options: Sequence[Option]) -> int:
        order = sorted(range(len(options)), key=lambda i: options[i].slot)
        prev = self.last.get(pool, -1)
        chosen = next((i for i in order if options[i].slot > prev), order[0])
        self.last[pool] = options[chosen].slot
        return chosen

    def select_worker(self, options: Sequence[Option], request: Request) -> int:
        return self._next("worker", options)

    def select_pair(self, prefills: Sequence[Option], decodes: Sequence[Option],
                    request: Request) -> tuple[int, int]:
        return self._next("prefill", prefills), self._next("decode", decodes)


def make_policy(name: str) -> RoutingPolicy:
    if name == PolicyName.COST.value:
        return CostPolicy()
    if name == PolicyName.CACHE_AWARE.value:
        return CacheAwarePolicy()
    if name == PolicyName.ROUND_ROBIN.value:
        return RoundRobinPolicy()
    raise ValueError(f"routing policy must be one of {POLICY_NAMES}, got {name!r}")
