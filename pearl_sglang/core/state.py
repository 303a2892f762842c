"""The unified GPU-worker-role table ``M = {w -> (G_w, R_w, a_w)}`` (paper section 4.4.1).

It is the single source of truth the router, the executors and the metrics read.  It is
immutable: every update (``events``) is a function from one snapshot to the next, and
``check`` (the invariants, at the end of this module) runs on each result.  Vocabulary:

* slot: a worker's stable id.  Slots are never renumbered; a new worker takes the lowest
  empty slot.
* zone: DEDICATED (rollout GPUs, preemptible ones included, that join and leave) or
  OVERLAP (training GPUs that rollout may borrow).  Overlap rollout workers keep their
  process across handoffs and sit INACTIVE while training owns their GPUs.
* activity: ACTIVE (routable), INACTIVE (process kept, serves nothing), or transitioning:
  JOINING (starting, syncing weights), LEAVING (draining, GPUs due back), SWITCHING
  (being given ``pending_role``).  A SWITCHING worker whose ``pending_role`` equals its
  role is *held*: it lost its PD partner and waits to be admitted with a new one.
* members: workers in or entering the active set (ACTIVE, JOINING, SWITCHING); their
  *intended* role (``pending_role`` while switching) is what the planner plans from.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Iterable, Mapping

from pearl_sglang.core.errors import InvalidSnapshot, InvariantViolation, UnknownWorker
from pearl_sglang.core.topology import Topology


class Zone(str, Enum):
    DEDICATED = "dedicated"
    OVERLAP = "overlap"


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    TRAINING = "training"


ROLLOUT_ROLES = (Role.PREFILL, Role.DECODE, Role.COLOCATED)


class Activity(str, Enum):
    ACTIVE = "active"
    INACTIVE = "inactive"
    JOINING = "joining"
    LEAVING = "leaving"
    SWITCHING = "switching"


MEMBER_ACTIVITIES = frozenset({Activity.ACTIVE, Activity.JOINING, Activity.SWITCHING})
# On their way to serving: starting, or relaunching in a new role.
ARRIVING_ACTIVITIES = frozenset({Activity.JOINING, Activity.SWITCHING})


class OverlapOwner(str, Enum):
    """Who may use the overlap GPUs: training, rollout, or rollout handing them back."""

    TRAINING = "training"
    ROLLOUT = "rollout"
    RETURNING = "returning"


@dataclass(frozen=True)
class WorkerRecord:
    slot: int
    gpus: tuple[str, ...]
    zone: Zone
    role: Role
    activity: Activity
    pending_role: Role | None = None
    weight_version: str | None = None
    endpoint: str | None = None
    bootstrap_port: int | None = None

    @property
    def is_rollout(self) -> bool:
        return self.role is not Role.TRAINING

    @property
    def is_member(self) -> bool:
        return self.is_rollout and self.activity in MEMBER_ACTIVITIES

    @property
    def intended_role(self) -> Role:
        return self.pending_role if self.activity is Activity.SWITCHING and self.pending_role else self.role

    @property
    def held(self) -> bool:
        return self.activity is Activity.SWITCHING and self.pending_role is self.role

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "gpus": list(self.gpus),
            "zone": self.zone.value,
            "role": self.role.value,
            "activity": self.activity.value,
            "pending_role": self.pending_role.value if self.pending_role else None,
            "weight_version": self.weight_version,
            "endpoint": self.endpoint,
            "bootstrap_port": self.bootstrap_port,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkerRecord":
        if not isinstance(data, Mapping):
            raise InvalidSnapshot(f"a worker record must be an object, got {data!r}")
        try:
            pending = data.get("pending_role")
            record = cls(
                slot=_int(data["slot"], "slot"),
                gpus=tuple(_str(g, "gpus") for g in _list(data["gpus"], "gpus")),
                zone=Zone(data["zone"]),
                role=Role(data["role"]),
                activity=Activity(data["activity"]),
                pending_role=Role(pending) if pending is not None else None,
                weight_version=_opt_str(data.get("weight_version"), "weight_version"),
                endpoint=_opt_str(data.get("endpoint"), "endpoint"),
                bootstrap_port=_bootstrap_port(_opt_int(data.get("bootstrap_port"), "bootstrap_port")),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, InvalidSnapshot):
                raise
            raise InvalidSnapshot(f"bad worker record {dict(data)!r}: {e}") from e
        return record


def _list(v: Any, key: str) -> list[Any]:
    if not isinstance(v, (list, tuple)):
        raise InvalidSnapshot(f"{key} must be a list, got {v!r}", key=key)
    return list(v)


def _int(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidSnapshot(f"{key} must be an integer, got {v!r}", key=key)
    return v


def _non_negative(v: int, key: str) -> int:
    if v < 0:
        raise InvalidSnapshot(f"{key} must be >= 0, got {v}", key=key)
    return v


def _bootstrap_port(v: int | None) -> int | None:
    if v is not None and not 0 < v <= 65535:
        raise InvalidSnapshot(f"bootstrap_port must be in [1, 65535], got {v}", key="bootstrap_port")
    return v


def _opt_int(v: Any, key: str) -> int | None:
    return None if v is None else _int(v, key)


def _str(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise InvalidSnapshot(f"{key} must be a string, got {v!r}", key=key)
    return v


def _opt_str(v: Any, key: str) -> str | None:
    return None if v is None else _str(v, key)


# GPUs one worker spans (tensor parallelism): a bound on what configs and flags may ask for.
MAX_TP_SIZE = 1024


def is_gpu_id(value: Any) -> bool:
    """``node:index``: a node name (ASCII letters, digits, '.', '_', '-'; a host name or a
    label) and the GPU's index on that node."""
    if not isinstance(value, str) or not value.isascii():
        return False
    node, sep, index = value.rpartition(":")
    return (bool(sep) and 0 < len(node) <= 128 and node[0].isalnum()
            and all(c.isalnum() or c in "._-" for c in node) and index.isdigit() and len(index) <= 4)


def gpu_node(gpu: str) -> str:
    """Node part of a GPU id ``"node0:3"``; TP groups never span nodes."""
    return gpu.rsplit(":", 1)[0] if ":" in gpu else ""


@dataclass(frozen=True)
class StateTable:
    """One snapshot of the table.  Build through ``create`` so invariants are checked."""

    tp_size: int
    dedicated_gpus: frozenset[str] = frozenset()
    overlap_gpus: frozenset[str] = frozenset()
    overlap_owner: OverlapOwner = OverlapOwner.TRAINING
    workers: tuple[WorkerRecord, ...] = ()
    revision: int = 0
    _by_slot: dict[int, WorkerRecord] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(sorted(self.workers, key=lambda w: w.slot)))
        object.__setattr__(self, "_by_slot", {w.slot: w for w in self.workers})

    @classmethod
    def create(
        cls,
        *,
        tp_size: int,
        dedicated_gpus: Iterable[str] = (),
        overlap_gpus: Iterable[str] = (),
        overlap_owner: OverlapOwner = OverlapOwner.TRAINING,
        workers: Iterable[WorkerRecord] = (),
    ) -> "StateTable":
        table = cls(tp_size, frozenset(dedicated_gpus), frozenset(overlap_gpus), overlap_owner, tuple(workers))
        check(table)
        return table

    # -- queries the router and control plane use ------------------------------------
    @property
    def training_owns_overlap(self) -> bool:
        return self.overlap_owner is OverlapOwner.TRAINING

    def worker(self, slot: int) -> WorkerRecord:
        try:
            return self._by_slot[slot]
        except KeyError:
            raise UnknownWorker(f"no worker in slot {slot}", key="slot") from None

    def has(self, slot: int) -> bool:
        return slot in self._by_slot

    def rollout_workers(self) -> tuple[WorkerRecord, ...]:
        return tuple(w for w in self.workers if w.is_rollout)

    def active(self, role: Role | None = None) -> tuple[WorkerRecord, ...]:
        """Routable workers, optionally of one role, in slot order."""
        return tuple(
            w for w in self.workers
            if w.is_rollout and w.activity is Activity.ACTIVE and (role is None or w.role is role)
        )

    def members(self) -> tuple[WorkerRecord, ...]:
        return tuple(w for w in self.workers if w.is_member)

    def active_topology(self) -> Topology:
        return _count(w.role for w in self.active())

    def topology(self) -> Topology:
        """The topology the table is heading to: members by intended role."""
        return _count(w.intended_role for w in self.members())

    def available_gpus(self) -> frozenset[str]:
        """GPUs rollout may use now: the dedicated zone, plus overlap while rollout owns it."""
        if self.overlap_owner is OverlapOwner.ROLLOUT:
            return self.dedicated_gpus | self.overlap_gpus
        return self.dedicated_gpus

    def bound_gpus(self) -> frozenset[str]:
        """GPUs held by any rollout process (leaving and inactive ones included)."""
        return frozenset(g for w in self.rollout_workers() for g in w.gpus)

    def free_gpu_groups(self, available: frozenset[str] | None = None) -> tuple[tuple[Zone, tuple[str, ...]], ...]:
        """Whole TP groups of available GPUs no rollout process holds, per node, in order."""
        pool = (self.available_gpus() if available is None else available) - self.bound_gpus()
        groups = []
        for zone, zone_gpus in ((Zone.DEDICATED, self.dedicated_gpus), (Zone.OVERLAP, self.overlap_gpus)):
            by_node: dict[str, list[str]] = {}
            for g in sorted(pool & zone_gpus, key=_gpu_sort_key):
                by_node.setdefault(gpu_node(g), []).append(g)
            for node in sorted(by_node):
                gs = by_node[node]
                for i in range(0, len(gs) - self.tp_size + 1, self.tp_size):
                    groups.append((zone, tuple(gs[i:i + self.tp_size])))
        return tuple(groups)

    def budget(self, available: frozenset[str] | None = None) -> int:
        """Workers rollout could run on ``available``: members and retained processes
        whose GPUs are all available, plus whole free TP groups."""
        pool = self.available_gpus() if available is None else available
        usable = sum(
            1 for w in self.rollout_workers()
            if (w.is_member or w.activity is Activity.INACTIVE) and set(w.gpus) <= pool
        )
        return usable + len(self.free_gpu_groups(pool))

    def free_slots(self) -> Iterable[int]:
        """Empty slots, lowest first, then fresh ones (an endless iterator)."""
        slot = 0
        while True:
            if slot not in self._by_slot:
                yield slot
            slot += 1

    # -- updates (used by ``events``; they do not check invariants themselves) --------
    def with_workers(self, workers: Iterable[WorkerRecord]) -> "StateTable":
        return replace(self, workers=tuple(workers))

    def put(self, record: WorkerRecord) -> "StateTable":
        rest = [w for w in self.workers if w.slot != record.slot]
        return self.with_workers(rest + [record])

    def drop(self, slot: int) -> "StateTable":
        self.worker(slot)
        return self.with_workers(w for w in self.workers if w.slot != slot)

    # -- serialization -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "tp_size": self.tp_size,
            "dedicated_gpus": sorted(self.dedicated_gpus, key=_gpu_sort_key),
            "overlap_gpus": sorted(self.overlap_gpus, key=_gpu_sort_key),
            "overlap_owner": self.overlap_owner.value,
            "revision": self.revision,
            "workers": [w.to_dict() for w in self.workers],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StateTable":
        try:
            table = cls(
                tp_size=_int(data["tp_size"], "tp_size"),
                dedicated_gpus=frozenset(_str(g, "dedicated_gpus")
                                         for g in _list(data.get("dedicated_gpus", ()), "dedicated_gpus")),
                overlap_gpus=frozenset(_str(g, "overlap_gpus")
                                       for g in _list(data.get("overlap_gpus", ()), "overlap_gpus")),
                overlap_owner=OverlapOwner(data.get("overlap_owner", OverlapOwner.TRAINING.value)),
                workers=tuple(WorkerRecord.from_dict(w) for w in _list(data.get("workers", ()), "workers")),
                revision=_non_negative(_int(data.get("revision", 0), "revision"), "revision"),
            )
        except InvalidSnapshot:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidSnapshot(f"bad table: {e!r}") from e
        check(table)
        return table


def _count(roles: Iterable[Role]) -> Topology:
    roles = list(roles)
    return Topology(
        prefill=roles.count(Role.PREFILL),
        decode=roles.count(Role.DECODE),
        colocated=roles.count(Role.COLOCATED),
    )


def _gpu_sort_key(gpu: str) -> tuple[str, int, str]:
    node, _, idx = gpu.rpartition(":")
    return (node, int(idx), gpu) if idx.isdigit() else (node, -1, gpu)


# -- invariants, checked after every update of the table -----------------------------
#
# 1. Slots are unique and non-negative; GPU ids are unique per zone and the zones are
#    disjoint.
# 2. No GPU is bound to two rollout workers (leaving and inactive ones included: a GPU
#    is free only once its last process let go).  Training workers share GPUs with
#    overlap rollout workers by design; they never share among themselves.
# 3. Every rollout worker has ``tp_size`` GPUs.  A dedicated worker's GPUs belong to the
#    dedicated zone unless it is LEAVING (its GPUs may already have been reclaimed); an
#    overlap worker's GPUs always belong to the overlap zone.  Training workers live in
#    the overlap zone only.
# 4. An overlap rollout worker is never ACTIVE, JOINING or SWITCHING while training owns
#    or is taking back its GPUs (RETURNING allows only LEAVING and INACTIVE).  Training
#    workers are ACTIVE exactly when training owns the overlap zone.
# 5. The active topology is servable: empty, all colocated, or at least one prefill *and*
#    one decode worker (colocated workers may serve beside a PD pair while a mode switch
#    is under way).  A lone prefill or decode pool is never active.
# 6. ``pending_role`` is set exactly on SWITCHING workers and names a rollout role;
#    dedicated workers are never INACTIVE (only overlap processes are retained).


def violations(table: StateTable) -> list[str]:
    out: list[str] = []
    if table.tp_size < 1:
        out.append(f"tp_size must be >= 1, got {table.tp_size}")
    slots = [w.slot for w in table.workers]
    if len(set(slots)) != len(slots) or any(s < 0 for s in slots):
        out.append(f"slots must be unique and non-negative: {slots}")
    if table.dedicated_gpus & table.overlap_gpus:
        out.append(f"GPUs in both zones: {sorted(table.dedicated_gpus & table.overlap_gpus)}")

    rollout = Counter(g for w in table.workers if w.is_rollout for g in w.gpus)
    training = Counter(g for w in table.workers if not w.is_rollout for g in w.gpus)
    for counter, what in ((rollout, "rollout"), (training, "training")):
        shared = sorted(g for g, n in counter.items() if n > 1)
        if shared:
            out.append(f"GPUs bound to two {what} workers: {shared}")

    for w in table.workers:
        out.extend(_record_violations(table, w))

    active = table.active_topology()
    if (active.prefill >= 1) != (active.decode >= 1):
        out.append(f"active topology {active.label()} has a prefill pool without decode or vice versa")
    return out


def _record_violations(table: StateTable, w: WorkerRecord) -> list[str]:
    out = []
    tag = f"slot {w.slot}"
    if len(set(w.gpus)) != len(w.gpus) or not w.gpus:
        out.append(f"{tag}: GPU list must be non-empty without repeats")
    if w.pending_role is not None and (w.activity is not Activity.SWITCHING or w.pending_role not in ROLLOUT_ROLES):
        out.append(f"{tag}: pending_role only on a SWITCHING rollout worker")
    if w.activity is Activity.SWITCHING and w.pending_role is None:
        out.append(f"{tag}: SWITCHING needs a pending_role")
    if not w.is_rollout:
        if w.zone is not Zone.OVERLAP or not set(w.gpus) <= table.overlap_gpus:
            out.append(f"{tag}: training workers live on overlap GPUs only")
        expected = Activity.ACTIVE if table.training_owns_overlap else Activity.INACTIVE
        if w.activity is not expected:
            out.append(f"{tag}: training worker must be {expected.value} while owner is {table.overlap_owner.value}")
        return out
    if len(w.gpus) != table.tp_size:
        out.append(f"{tag}: has {len(w.gpus)} GPUs, tp_size is {table.tp_size}")
    if w.zone is Zone.DEDICATED:
        if w.activity is Activity.INACTIVE:
            out.append(f"{tag}: dedicated workers are never inactive")
        if w.activity is not Activity.LEAVING and not set(w.gpus) <= table.dedicated_gpus:
            out.append(f"{tag}: bound to GPUs outside the dedicated zone")
    else:
        if not set(w.gpus) <= table.overlap_gpus:
            out.append(f"{tag}: overlap worker bound to GPUs outside the overlap zone")
        allowed = {
            OverlapOwner.TRAINING: {Activity.INACTIVE},
            OverlapOwner.RETURNING: {Activity.INACTIVE, Activity.LEAVING},
            OverlapOwner.ROLLOUT: set(Activity),
        }[table.overlap_owner]
        if w.activity not in allowed:
            out.append(f"{tag}: overlap worker {w.activity.value} while owner is {table.overlap_owner.value}")
    return out


def check(table: StateTable) -> StateTable:
    """Return ``table`` unchanged or raise ``InvariantViolation`` listing every breach."""
    found = violations(table)
    if found:
        raise InvariantViolation("; ".join(found))
    return table
