"""Where a request goes: pure routing over the state table (no I/O, no private copies).

Colocated mode keeps a trajectory's turns on the worker that holds its prefix (cache
affinity), unless that worker is overloaded, excluded or no longer active; otherwise the
least loaded worker. PD mode picks the prefill that holds the prefix (same rule) and the
least-loaded decode. Prefix ownership is learned from the requests themselves: prompts
are cut into fixed blocks whose chained hashes map to the slot that last served them, so
the next turn of a trajectory (whose prompt extends the previous one) finds its worker
without any client cooperation; an explicit trajectory id, when given, wins.

A worker whose weights lag more adopted pushes than the control plane allows (its
``PushLog``, read on every choice) is never chosen; the control plane repairs it.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.state import Role, StateTable, WorkerRecord

TOKEN_BLOCK = 64
CHAR_BLOCK = 256


class NoRoute(Exception):
    """No active worker (or PD pair) can take the request right now."""


@dataclass(frozen=True)
class Target:
    """A colocated worker, or a prefill + decode pair."""

    worker: WorkerRecord | None = None
    prefill: WorkerRecord | None = None
    decode: WorkerRecord | None = None

    @property
    def is_pd(self) -> bool:
        return self.prefill is not None

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(w.slot for w in (self.worker, self.prefill, self.decode) if w is not None)

    @property
    def prefix_holder(self) -> WorkerRecord:
        return self.prefill if self.prefill is not None else self.worker  # type: ignore[return-value]


def prefix_key(input_ids: Sequence[int] | None, text: str | None) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks; equal prefixes share leading hashes."""
    if input_ids is not None:
        return extend_prefix_key((), input_ids)
    hashes: list[int] = []
    h = 0
    if text is not None:
        for start in range(0, len(text) - CHAR_BLOCK + 1, CHAR_BLOCK):
            h = hash((h, text[start:start + CHAR_BLOCK]))
            hashes.append(h)
    return tuple(hashes)


def extend_prefix_key(key: tuple[int, ...], ids: Sequence[int], more: Sequence[int] = ()) -> tuple[int, ...]:
    """``prefix_key(ids + more)`` given ``key == prefix_key(ids)``: only new blocks are hashed."""
    start = len(key) * TOKEN_BLOCK
    tail = list(ids[start:]) + list(more) if more else ids[start:]
    hashes, h = list(key), key[-1] if key else 0
    for i in range(0, len(tail) - TOKEN_BLOCK + 1, TOKEN_BLOCK):
        h = hash((h, tuple(tail[i:i + TOKEN_BLOCK])))
        hashes.append(h)
    return tuple(hashes)


@dataclass(frozen=True)
class SelectionPolicy:
    """Affinity yields when the holder has ``balance_abs`` more requests than the least
    loaded worker and more than ``balance_rel`` times its load."""

    balance_abs: int = 16
    balance_rel: float = 1.5
    max_prefix_blocks: int = 1 << 20
    max_trajectories: int = 1 << 16


class Selector:
    """Routing core. Holds only learned affinity, never worker state; ``pushes`` reads
    the control plane's weight log (None: no bound, e.g. attach mode)."""

    def __init__(self, policy: SelectionPolicy = SelectionPolicy(),
                 pushes: Callable[[], PushLog | None] = lambda: None) -> None:
        self.policy = policy
        self.pushes = pushes
        self._block_owner: OrderedDict[int, int] = OrderedDict()
        self._trajectory_owner: OrderedDict[str, int] = OrderedDict()

    def choose(self, table: StateTable, *, load: Mapping[int, int], key: tuple[int, ...],
               trajectory: str | None = None, exclude: Iterable[int] = ()) -> Target:
        excluded = set(exclude)
        log = self.pushes()
        if log is not None:
            excluded |= {w.slot for w in table.active() if not log.servable(w.weight_version)}
        colocated = [w for w in table.active(Role.COLOCATED) if w.slot not in excluded and w.endpoint]
        if colocated:
            return Target(worker=self._with_affinity(colocated, load, key, trajectory))
        prefills = [w for w in table.active(Role.PREFILL)
                    if w.slot not in excluded and w.endpoint and w.bootstrap_port is not None]
        decodes = [w for w in table.active(Role.DECODE) if w.slot not in excluded and w.endpoint]
        if not prefills or not decodes:
            raise NoRoute("no active colocated worker and no complete prefill/decode pair")
        return Target(prefill=self._with_affinity(prefills, load, key, trajectory),
                      decode=_least_loaded(decodes, load))

    def remember(self, target: Target, key: tuple[int, ...], trajectory: str | None = None) -> None:
        slot = target.prefix_holder.slot
        for h in key:
            self._block_owner[h] = slot
            self._block_owner.move_to_end(h)
        while len(self._block_owner) > self.policy.max_prefix_blocks:
            self._block_owner.popitem(last=False)
        if trajectory is not None:
            self._trajectory_owner[trajectory] = slot
            self._trajectory_owner.move_to_end(trajectory)
            while len(self._trajectory_owner) > self.policy.max_trajectories:
                self._trajectory_owner.popitem(last=False)

    def holder(self, key: tuple[int, ...], trajectory: str | None = None) -> int | None:
        if trajectory is not None and trajectory in self._trajectory_owner:
            return self._trajectory_owner[trajectory]
        for h in reversed(key):
            if h in self._block_owner:
                return self._block_owner[h]
        return None

    def _with_affinity(self, workers: list[WorkerRecord], load: Mapping[int, int],
                       key: tuple[int, ...], trajectory: str | None) -> WorkerRecord:
        least = _least_loaded(workers, load)
        slot = self.holder(key, trajectory)
        holder = next((w for w in workers if w.slot == slot), None)
        if holder is None:
            return least
        held, lowest = load.get(holder.slot, 0), load.get(least.slot, 0)
        overloaded = held - lowest > self.policy.balance_abs and held > self.policy.balance_rel * lowest
        return least if overloaded else holder


def _least_loaded(workers: list[WorkerRecord], load: Mapping[int, int]) -> WorkerRecord:
    return min(workers, key=lambda w: (load.get(w.slot, 0), w.slot))
