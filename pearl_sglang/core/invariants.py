"""State invariants, checked after every update of the table.

1. Slots are unique and non-negative; GPU ids are unique per zone and the zones are
   disjoint.
2. No GPU is bound to two rollout workers (leaving and inactive ones included: a GPU
   is free only once its last process let go).  Training workers share GPUs with
   overlap rollout workers by design; they never share among themselves.
3. Every rollout worker has ``tp_size`` GPUs.  A dedicated worker's GPUs belong to the
   dedicated zone unless it is LEAVING (its GPUs may already have been reclaimed); an
   overlap worker's GPUs always belong to the overlap zone.  Training workers live in
   the overlap zone only.
4. An overlap rollout worker is never ACTIVE, JOINING or SWITCHING while training owns
   or is taking back its GPUs (RETURNING allows only LEAVING and INACTIVE).  Training
   workers are ACTIVE exactly when training owns the overlap zone.
5. The active topology is servable: empty, all colocated, or at least one prefill *and*
   one decode worker (colocated workers may serve beside a PD pair while a mode switch
   is under way).  A lone prefill or decode pool is never active.
6. ``pending_role`` is set exactly on SWITCHING workers and names a rollout role;
   dedicated workers are never INACTIVE (only overlap processes are retained).
"""
from __future__ import annotations

from collections import Counter

from pearl_sglang.core.errors import InvariantViolation
from pearl_sglang.core.state import ROLLOUT_ROLES, Activity, OverlapOwner, StateTable, WorkerRecord, Zone


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


__all__ = ["check", "violations"]
