"""Minimal-change plans from the current table to a target topology (section 4.4.2).

Given the table, a target ``(N_P, N_D, N_C)`` and the GPUs rollout may use, produce
``(W_add, W_remove, rho)`` with exactly ``D_worker + D_role`` changes, equations (5)
and (6), where ``W`` is the current member set (workers in or entering service) and
every member keeps its *intended* role unless rho changes it:

* members whose GPUs are no longer available must leave;
* every surviving role keeps up to its target count of members in that role;
* the remaining deficits are filled by the other survivors (role changes), and only
  then by added workers; survivors nobody needs leave.

Trading a role change for a leave plus a join always costs one more change, so this is
the minimum; ``tests/core/test_planner_properties.py`` checks it against brute force.
Among minimal plans the cheapest by ``ChangeCosts`` wins: a prefill <-> decode switch
in place before a colocated <-> PD relaunch, resuming a retained overlap process before
a cold start, removing joining or overlap workers before serving dedicated ones.
Slots are never renumbered; new workers take the lowest empty slots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pearl_sglang.core.errors import InfeasibleTarget, InvalidConfig, InvalidSnapshot
from pearl_sglang.core.state import ROLLOUT_ROLES, Activity, Role, StateTable, WorkerRecord, Zone
from pearl_sglang.core.topology import Topology


@dataclass(frozen=True)
class ChangeCosts:
    """Relative weights that only break ties between plans of equal change count.

    Defaults follow the paper's Table 3 orders of magnitude: resuming a retained
    process takes seconds, a cold start about a minute, an in-place role switch a few
    seconds, a colocated <-> PD change a process restart.
    """

    remove: float = 1.0
    activate_retained: float = 1.0
    launch: float = 10.0
    pd_switch: float = 2.0
    relaunch: float = 8.0

    def switch(self, old: Role, new: Role) -> float:
        if old is new:
            return 0.0
        if {old, new} == {Role.PREFILL, Role.DECODE}:
            return self.pd_switch
        return self.relaunch


@dataclass(frozen=True)
class WorkerAdd:
    slot: int
    gpus: tuple[str, ...]
    zone: Zone
    role: Role
    retained: bool  # True: resume the INACTIVE process already in this slot

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "gpus": list(self.gpus), "zone": self.zone.value,
                "role": self.role.value, "retained": self.retained}


@dataclass(frozen=True)
class RoleChange:
    slot: int
    old: Role
    new: Role

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "old": self.old.value, "new": self.new.value}


@dataclass(frozen=True)
class Plan:
    target: Topology
    add: tuple[WorkerAdd, ...]
    remove: tuple[int, ...]
    switch: tuple[RoleChange, ...]
    keep: tuple[tuple[int, Role], ...]
    cost: float

    @property
    def d_worker(self) -> int:
        return len(self.add) + len(self.remove)

    @property
    def d_role(self) -> int:
        return len(self.switch)

    @property
    def change_count(self) -> int:
        return self.d_worker + self.d_role

    @property
    def is_empty(self) -> bool:
        return self.change_count == 0

    def rho(self) -> dict[int, Role]:
        """The paper's rho: every surviving member's role after the plan."""
        out = dict(self.keep)
        out.update({c.slot: c.new for c in self.switch})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.to_dict(),
            "add": [a.to_dict() for a in self.add],
            "remove": list(self.remove),
            "switch": [c.to_dict() for c in self.switch],
            "keep": [{"slot": s, "role": r.value} for s, r in self.keep],
            "d_worker": self.d_worker,
            "d_role": self.d_role,
            "change_count": self.change_count,
            "cost": self.cost,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        try:
            t = data["target"]
            return cls(
                target=Topology(prefill=t["prefill"], decode=t["decode"], colocated=t["colocated"]),
                add=tuple(WorkerAdd(a["slot"], tuple(a["gpus"]), Zone(a["zone"]), Role(a["role"]), bool(a["retained"]))
                          for a in data["add"]),
                remove=tuple(int(s) for s in data["remove"]),
                switch=tuple(RoleChange(c["slot"], Role(c["old"]), Role(c["new"])) for c in data["switch"]),
                keep=tuple((k["slot"], Role(k["role"])) for k in data["keep"]),
                cost=float(data["cost"]),
            )
        except (KeyError, TypeError, ValueError, InvalidConfig) as e:
            raise InvalidSnapshot(f"bad plan: {e!r}") from e


_ACTIVITY_RANK = {Activity.ACTIVE: 0, Activity.SWITCHING: 1, Activity.JOINING: 2}


def _keep_rank(w: WorkerRecord) -> tuple[int, int, int]:
    """Lower is kept first: serving before starting, dedicated before overlap."""
    return (_ACTIVITY_RANK.get(w.activity, 3), 0 if w.zone is Zone.DEDICATED else 1, w.slot)


def _target_counts(target: Topology) -> dict[Role, int]:
    return {Role.PREFILL: target.prefill, Role.DECODE: target.decode, Role.COLOCATED: target.colocated}


def _assign(units: Iterable[Any], deficit: dict[Role, int], cost) -> list[tuple[Any, Role]]:
    """Greedy cheapest pairing of units to deficit roles.  Costs depend on role pairs
    only (plus ranks that break ties), so cheapest-first is optimal here."""
    units = list(units)
    pairs = sorted((cost(u, r), i, ROLLOUT_ROLES.index(r)) for i, u in enumerate(units) for r in ROLLOUT_ROLES)
    used: set[int] = set()
    out = []
    for _, i, ri in pairs:
        r = ROLLOUT_ROLES[ri]
        if i in used or deficit[r] <= 0:
            continue
        used.add(i)
        deficit[r] -= 1
        out.append((units[i], r))
    return out


def plan(
    table: StateTable,
    target: Topology,
    *,
    available: Iterable[str] | None = None,
    costs: ChangeCosts = ChangeCosts(),
) -> Plan:
    if not (target.is_valid or target.total == 0):
        raise InvalidConfig(f"target {target.label()} is neither colocated nor a PD pair", key="target")
    pool = table.available_gpus() if available is None else frozenset(available)
    members = table.members()
    leaving = [w for w in members if not set(w.gpus) <= pool]
    survivors = sorted((w for w in members if set(w.gpus) <= pool), key=_keep_rank)

    deficit = _target_counts(target)
    keep: list[tuple[int, Role]] = []
    excess: list[WorkerRecord] = []
    for w in survivors:
        r = w.intended_role
        if deficit[r] > 0:
            deficit[r] -= 1
            keep.append((w.slot, r))
        else:
            excess.append(w)

    moved = _assign(excess, deficit,
                    lambda w, r: (costs.switch(w.intended_role, r) if r is not w.intended_role else float("inf"),
                                  _keep_rank(w)))
    switch = tuple(sorted((RoleChange(w.slot, w.intended_role, r) for w, r in moved), key=lambda c: c.slot))
    moved_slots = {w.slot for w, _ in moved}
    remove = sorted([w.slot for w in leaving] + [w.slot for w in excess if w.slot not in moved_slots])

    adds = _fill(table, pool, deficit, costs)
    cost = (costs.remove * len(remove) + sum(costs.switch(c.old, c.new) for c in switch)
            + sum(_add_cost(table, a, costs) for a in adds))
    return Plan(target, tuple(adds), tuple(remove), switch, tuple(sorted(keep)), cost)


def _add_cost(table: StateTable, add: WorkerAdd, costs: ChangeCosts) -> float:
    if add.retained:
        return costs.activate_retained + costs.switch(table.worker(add.slot).role, add.role)
    return costs.launch


def _fill(table: StateTable, pool: frozenset[str], deficit: dict[Role, int], costs: ChangeCosts) -> list[WorkerAdd]:
    need = sum(deficit.values())
    if need == 0:
        return []
    retained = [w for w in table.rollout_workers() if w.activity is Activity.INACTIVE and set(w.gpus) <= pool]
    free = table.free_gpu_groups(pool)
    if len(retained) + len(free) < need:
        raise InfeasibleTarget(
            f"target needs {need} more workers but only {len(retained) + len(free)} can be placed "
            f"({len(retained)} retained, {len(free)} free GPU groups of {table.tp_size})", key="target")
    slots = table.free_slots()
    units: list[WorkerAdd] = [WorkerAdd(w.slot, w.gpus, w.zone, w.role, True) for w in retained]
    units += [WorkerAdd(next(slots), gpus, zone, Role.COLOCATED, False) for zone, gpus in free[:need]]

    def unit_cost(u: WorkerAdd, r: Role) -> tuple[float, int, int]:
        base = costs.activate_retained + costs.switch(u.role, r) if u.retained else costs.launch
        return (base, 0 if u.zone is Zone.DEDICATED else 1, u.slot)

    chosen = _assign(units, deficit, unit_cost)
    return sorted((WorkerAdd(u.slot, u.gpus, u.zone, r, u.retained) for u, r in chosen), key=lambda a: a.slot)
