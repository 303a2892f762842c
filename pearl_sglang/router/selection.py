"""Where a request goes: filters over the state table, then a pluggable routing policy.

Filters first, the same for every policy: only active workers with an endpoint, none
that failed this request or whose circuit is open (``exclude``), none whose weights lag
more adopted pushes than the control plane allows (its ``PushLog``, read on every
choice; the control plane repairs such a worker). The policy (``routing_policy``) then
picks one colocated worker, or a prefill + decode pair. While a colocated <-> PD change
runs in waves the pool is mixed (colocated workers beside PD pairs); then the side whose
least busy worker (a decode worker, for pairs) has fewer sequences takes the request, so
new workers serve as soon as they are admitted and old ones until they relaunch.

Prefix ownership is learned from the requests themselves: prompts are cut into fixed
blocks whose chained hashes map to the workers that served them and the latest of them
(``prefix_map``, bounded and least-recently-used), so the next turn of a trajectory (whose
prompt extends the previous one) finds the workers that hold its prefix without client
cooperation; an explicit trajectory id names the worker of its latest turn. Holds only
learned affinity and recency, never worker state.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from pearl_sglang.core.placement import IDLE, CostRates, Option, WorkerLoad
from pearl_sglang.core.presets import qwen3_8b_tp2
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.straggler_isolation import Isolation, choose_colocated_isolated, choose_pair_isolated
from pearl_sglang.core.state import Role, StateTable, WorkerRecord
from pearl_sglang.router import block_keys, prefix_map
from pearl_sglang.router.encoded_ids import EncodedIds
from pearl_sglang.router.routing_policy import Request, RoutingPolicy, make_policy

TOKEN_BLOCK = 64
CHAR_BLOCK = 256  # about TOKEN_BLOCK tokens of text
DEFAULT_RATES = CostRates.from_profile(qwen3_8b_tp2())


class NoRoute(Exception):
    """No active worker (or PD pair) can take the request right now."""


def _least_busy(workers: Sequence[WorkerRecord], loads: Mapping[int, WorkerLoad]) -> float:
    return min(loads.get(w.slot, IDLE).sequences for w in workers)


@dataclass(frozen=True)
class Target:
    """A colocated worker, or a prefill + decode pair."""

    worker: WorkerRecord | None = None
    prefill: WorkerRecord | None = None
    decode: WorkerRecord | None = None
    prefill_tokens: int = 0  # what the prefix holder must compute (context - its cached prefix)

    @property
    def is_pd(self) -> bool:
        return self.prefill is not None

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(w.slot for w in (self.worker, self.prefill, self.decode) if w is not None)

    @property
    def prefix_holder(self) -> WorkerRecord:
        return self.prefill if self.prefill is not None else self.worker  # type: ignore[return-value]

    @property
    def main(self) -> WorkerRecord:
        """The worker that generates (the decode of a pair)."""
        return self.decode if self.decode is not None else self.worker  # type: ignore[return-value]


def _own_prefill(request: Request, chosen: Option) -> int:
    return max(0, request.context_tokens - chosen.matched_tokens)


def prefix_key(input_ids: Sequence[int] | None, text: str | None) -> tuple[int, ...]:
    """Chained keys of the prompt's full blocks; equal prefixes share leading keys."""
    if isinstance(input_ids, EncodedIds):
        if len(input_ids) < TOKEN_BLOCK:
            return ()
        if input_ids.array is not None:
            return block_keys.of_ids(input_ids.array, TOKEN_BLOCK)
        return block_keys.of_text(input_ids.text, input_ids.commas, TOKEN_BLOCK)
    if input_ids is not None:
        return extend_prefix_key((), input_ids)
    hashes: list[int] = []
    h = 0
    if text is not None:
        for start in range(0, len(text) - CHAR_BLOCK + 1, CHAR_BLOCK):
            h = hash((h, text[start:start + CHAR_BLOCK]))
            hashes.append(h)
    return tuple(hashes)


def context_tokens(input_ids: Sequence[int] | None, text: str | None) -> int:
    """The prompt's length in tokens (text: estimated at CHAR_BLOCK / TOKEN_BLOCK chars each)."""
    if input_ids is not None:
        return len(input_ids)
    return len(text or "") * TOKEN_BLOCK // CHAR_BLOCK


def extend_prefix_key(key: tuple[int, ...], ids: Sequence[int], more: Sequence[int] = ()) -> tuple[int, ...]:
    """``prefix_key(ids + more)`` given ``key == prefix_key(ids)``: only new blocks are keyed."""
    start = len(key) * TOKEN_BLOCK
    if len(ids) + len(more) - start < TOKEN_BLOCK:
        return key
    held = ids.array if isinstance(ids, EncodedIds) else None
    tail = held[start:] if held is not None else np.array(ids[start:], dtype=np.uint64)
    if len(more):
        tail = np.concatenate([tail, np.array(more, dtype=np.uint64)])
    return key + block_keys.of_ids(tail, TOKEN_BLOCK, key[-1] if key else 0)


@dataclass(frozen=True)
class SelectionPolicy:
    """Bounds of the learned maps (blocks and trajectories remembered, LRU)."""

    max_prefix_blocks: int = 1 << 20
    max_trajectories: int = 1 << 16


class Selector:
    """Routing: filters, then ``policy``. ``pushes`` reads the control plane's weight log
    (None: no bound, e.g. attach mode); ``rates`` the runtime profile's costs."""

    def __init__(self, policy: SelectionPolicy = SelectionPolicy(),
                 pushes: Callable[[], PushLog | None] = lambda: None, *,
                 routing: RoutingPolicy | str = "cost",
                 rates: Callable[[], CostRates] = lambda: DEFAULT_RATES) -> None:
        self.policy = policy
        self.pushes = pushes
        self.routing = make_policy(routing) if isinstance(routing, str) else routing
        self.rates = rates
        self._blocks = prefix_map.PrefixMap(policy.max_prefix_blocks)  # block key -> slots, latest
        self._last_key: tuple[int, ...] | None = None
        self._last_array = prefix_map.as_keys(())
        self._trajectory_owner: OrderedDict[str, int] = OrderedDict()
        self._assigned: dict[int, int] = {}                               # slot -> assignment number
        self._assignments = 0

    def choose(self, table: StateTable, *, loads: Mapping[int, WorkerLoad], key: tuple[int, ...],
               context: int | None = None, trajectory: str | None = None,
               exclude: Iterable[int] = (), isolation: Isolation | None = None) -> Target:
        """``context``: the prompt's tokens (default: its full blocks). ``isolation``: the
        step's tail has begun; the straggler cost term replaces the routing policy."""
        excluded = set(exclude)
        log = self.pushes()
        if log is not None:
            excluded |= {w.slot for w in table.active() if not log.servable(w.weight_version)}
        request = Request(key=key, context_tokens=context if context is not None else len(key) * TOKEN_BLOCK,
                          home=self.home(key, trajectory), rates=self.rates())
        colocated = [w for w in table.active(Role.COLOCATED) if w.slot not in excluded and w.endpoint]
        prefills = [w for w in table.active(Role.PREFILL)
                    if w.slot not in excluded and w.endpoint and w.bootstrap_port is not None]
        decodes = [w for w in table.active(Role.DECODE) if w.slot not in excluded and w.endpoint] if prefills else []
        if colocated and (not decodes or _least_busy(colocated, loads) <= _least_busy(decodes, loads)):
            options = self._options(colocated, loads, key)
            i = (self.routing.select_worker(options, request) if isolation is None else
                 choose_colocated_isolated(request.rates, options, context_tokens=request.context_tokens,
                                           isolation=isolation, holder=request.home,
                                           margin=getattr(self.routing, "margin", 0.0)))
            return Target(worker=colocated[i], prefill_tokens=_own_prefill(request, options[i]))
        if not prefills or not decodes:
            raise NoRoute("no active colocated worker and no complete prefill/decode pair")
        p_options = self._options(prefills, loads, key)
        d_options = self._options(decodes, loads, ())
        p, d = (self.routing.select_pair(p_options, d_options, request) if isolation is None else
                choose_pair_isolated(request.rates, p_options, d_options, context_tokens=request.context_tokens,
                                     isolation=isolation, holder=request.home,
                                     margin=getattr(self.routing, "margin", 0.0)))
        return Target(prefill=prefills[p], decode=decodes[d], prefill_tokens=_own_prefill(request, p_options[p]))

    def _options(self, workers: list[WorkerRecord], loads: Mapping[int, WorkerLoad],
                 key: tuple[int, ...]) -> list[Option]:
        matched = self.matched_tokens(key, [w.slot for w in workers]) if key else {}
        blocks, assigned = self._blocks, self._assigned
        return [Option(w.slot, loads.get(w.slot, IDLE), matched.get(w.slot, 0), assigned.get(w.slot, -1),
                       blocks.count(w.slot)) for w in workers]

    def remember(self, target: Target, key: tuple[int, ...], trajectory: str | None = None) -> None:
        slot = target.prefix_holder.slot
        for s in target.slots:
            self._assignments += 1
            self._assigned[s] = self._assignments
        self._blocks.remember(self._array(key), slot)
        if trajectory is not None:
            self._trajectory_owner[trajectory] = slot
            self._trajectory_owner.move_to_end(trajectory)
            while len(self._trajectory_owner) > self.policy.max_trajectories:
                self._trajectory_owner.popitem(last=False)

    def home(self, key: tuple[int, ...], trajectory: str | None = None) -> int | None:
        """Where the request's conversation lives, the worker placement keeps it on while
        that is within the policy's margin. With a trajectory id: the worker of its latest
        turn, and none on its first turn, even when copies of its prompt are cached (a GRPO
        group's shared prompt is no member's home: the members spread by cost alone, which
        already credits a worker for the prefix it holds). Without one: ``holder``."""
        if trajectory is not None:
            return self._trajectory_owner.get(trajectory)
        return self.holder(key)

    def holder(self, key: tuple[int, ...], trajectory: str | None = None) -> int | None:
        """The worker of the trajectory's latest turn, else the latest server of the
        longest known prefix."""
        if trajectory is not None and trajectory in self._trajectory_owner:
            return self._trajectory_owner[trajectory]
        return self._blocks.latest(self._array(key))

    def matched_tokens(self, key: tuple[int, ...], slots: Iterable[int]) -> dict[int, int]:
        """Tokens of ``key``'s prefix that each of ``slots`` holds (those holding none left
        out). What a worker holds of a key is a prefix of it (``prefix_map``)."""
        return self._blocks.held_tokens(self._array(key), list(slots), TOKEN_BLOCK)

    def _array(self, key: tuple[int, ...]) -> np.ndarray:
        """``key`` as the map's uint64 array; one request asks for the same key a few times."""
        if key is not self._last_key:
            self._last_key, self._last_array = key, prefix_map.as_keys(key)
        return self._last_array

    def state(self) -> dict[str, object]:
        return {"routing_policy": self.routing.name, "cached_blocks": self._blocks.counts()}
