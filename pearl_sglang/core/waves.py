"""Staged colocated <-> PD changes: which relaunches of a plan go first.

A colocated <-> PD change restarts the worker's process (tens of seconds to minutes on a
real engine). Begun all at once, a plan that relaunches every serving worker leaves the
cluster serving nothing until they are back. ``first_wave`` cuts a plan into the part to
begin now and the relaunches to defer: the deferred workers keep serving in their old
role while the wave's workers restart, the wave is admitted (the router serves colocated
workers beside PD pairs), and the control plane then plans the rest from the new table,
which is staged again. In-place prefill <-> decode switches, additions, removals and
workers that do not serve are never deferred: deferring them keeps nothing up.

Properties (``tests/core/test_waves.py``):

1. Part of the plan: the wave has the plan's additions, removals and keeps; its switches
   and the deferred ones partition the plan's switches; only relaunches of ACTIVE
   workers are deferred; a non-empty plan gives a wave that changes something.
2. Feasible: beginning the wave, then every change of it succeeding, gives tables that
   satisfy the invariants, and the second one serves.
3. Serving path kept: if some split keeps a serving path of the old topology up while
   the wave runs, the chosen one does (``keeps_serving``). Among those: the fewest waves
   (all at once if that keeps a path, else two when the rest can follow in one wave
   that keeps a path), then the most workers serving through this wave and the next.
4. No path can be kept (1P1D -> 2C, 2C -> 1P1D): the wave is the fewest relaunches that
   bring up a new serving path; the old workers it orphans are held out of routing.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from pearl_sglang.core.planner import ChangeCosts, Plan, RoleChange
from pearl_sglang.core.state import Activity, Role, StateTable

_RELAUNCHES = ((Role.COLOCATED, Role.PREFILL), (Role.COLOCATED, Role.DECODE),
               (Role.PREFILL, Role.COLOCATED), (Role.DECODE, Role.COLOCATED))


@dataclass(frozen=True)
class Wave:
    """``plan``: what to begin now. ``deferred``: relaunches left for later waves (their
    workers serve in the old role meanwhile). ``keeps_serving``: False when this wave
    takes the last serving path of the old topology down (no split could keep one)."""

    plan: Plan
    deferred: tuple[RoleChange, ...] = ()
    keeps_serving: bool = True

    @property
    def staged(self) -> bool:
        return bool(self.deferred)

    def to_dict(self) -> dict[str, Any]:
        return {"relaunch": [c.to_dict() for c in self.plan.switch if _is_relaunch(c)],
                "deferred": [c.to_dict() for c in self.deferred], "keeps_serving": self.keeps_serving}


def _is_relaunch(change: RoleChange) -> bool:
    return (change.old, change.new) in _RELAUNCHES


def _servable(roles: Counter) -> bool:
    return _valid(roles) and sum(roles.values()) > 0


def _valid(roles: Counter) -> bool:
    return (roles[Role.PREFILL] > 0) == (roles[Role.DECODE] > 0)


def _held_out(roles: Counter) -> Counter:
    """The serving roles once orphans are held (a prefill pool without decode or the reverse)."""
    if _valid(roles):
        return roles
    return Counter({r: n for r, n in roles.items() if r is Role.COLOCATED})


@dataclass(frozen=True)
class _Split:
    taken: tuple[int, ...]  # how many of each relaunch class the wave takes
    during: Counter         # serving roles while the wave runs (old workers left up)
    after: Counter          # serving roles once the wave is admitted
    next_during: Counter    # serving roles while the rest relaunches, all at once
    rest: int               # relaunches deferred

    @property
    def waves(self) -> int:
        """Waves in all if the next one takes the rest (3: more than two)."""
        if not self.rest:
            return 1
        return 2 if _servable(self.next_during) else 3

    @property
    def balance(self) -> int:
        return min(sum(self.during.values()), sum(self.next_during.values()))

    @property
    def keeps_path(self) -> bool:
        return _servable(self.during)

    @property
    def feasible(self) -> bool:
        return _servable(self.after)


def first_wave(table: StateTable, plan: Plan, costs: ChangeCosts = ChangeCosts()) -> Wave:
    """The part of ``plan`` to begin now (pure: the caller applies ``BeginPlan``)."""
    removed = set(plan.remove)
    serving = {w.slot: w for w in table.active() if w.slot not in removed}
    deferrable = [c for c in plan.switch if c.slot in serving and _is_relaunch(c)]
    if not deferrable:
        return Wave(plan)
    classes = [sorted((c for c in deferrable if (c.old, c.new) == k), key=lambda c: c.slot) for k in _RELAUNCHES]
    fixed = [c for c in plan.switch if c not in deferrable]
    # Roles that serve while the wave runs, before any deferrable relaunch is taken out.
    base = Counter(w.role for s, w in serving.items() if s not in {c.slot for c in fixed})
    # Roles the rest of the wave brings: fixed switches, additions, and switching (held)
    # members the plan keeps, which the wave admits in their intended role.
    touched = removed | {c.slot for c in plan.switch}
    arriving = Counter(c.new for c in fixed) + Counter(a.role for a in plan.add)
    arriving += Counter(w.intended_role for w in table.members()
                        if w.slot not in touched and w.activity is Activity.SWITCHING)

    def split(taken: tuple[int, ...]) -> _Split:
        out, new, rest = Counter(), Counter(), Counter()
        for (old_role, new_role), cls, n in zip(_RELAUNCHES, classes, taken):
            out[old_role] += n
            new[new_role] += n
            rest[old_role] += len(cls) - n
        during = base - out
        after = _held_out(during) + arriving + new
        return _Split(taken, during, after, _held_out(after - rest), sum(rest.values()))

    everything = tuple(len(cls) for cls in classes)
    splits = [split(t) for t in itertools.product(*(range(n + 1) for n in everything))]
    changes_something = [s for s in splits if s.feasible and (any(s.taken) or fixed or plan.add or plan.remove)]
    kept = [s for s in changes_something if s.keeps_path]
    if kept:
        # The fewest waves (the rest in one more wave that keeps a path, when possible),
        # then the most workers serving through this wave and the next, then the larger wave.
        best = max(kept, key=lambda s: (-s.waves, s.balance, sum(s.taken)))
    else:
        best = min(changes_something, key=lambda s: (sum(s.taken), s.taken), default=split(everything))
    now = fixed + [c for cls, n in zip(classes, best.taken) for c in cls[:n]]
    deferred = tuple(c for cls, n in zip(classes, best.taken) for c in cls[n:])
    if not deferred:
        return Wave(plan, keeps_serving=best.keeps_path or not _servable(Counter(w.role for w in table.active())))
    keep = tuple(sorted(plan.keep + tuple((c.slot, c.old) for c in deferred)))
    cost = plan.cost - sum(costs.switch(c.old, c.new) for c in deferred)
    wave = replace(plan, switch=tuple(sorted(now, key=lambda c: c.slot)), keep=keep, cost=cost)
    return Wave(wave, deferred, keeps_serving=best.keeps_path)


__all__ = ["Wave", "first_wave"]
