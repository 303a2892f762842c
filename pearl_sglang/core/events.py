"""Events: the only way the table changes.  Each is a pure function snapshot -> snapshot.

The control plane serializes calls (one asyncio lock in the shell) and does the I/O; the
functions here only decide what the next snapshot is.  ``apply`` checks the invariants
on the result and bumps ``revision``; ``apply_all`` applies a batch atomically (checked
once, at the end), which is how a group of workers is admitted together: a new prefill
worker and a new decode worker only form a servable topology side by side.

Lifecycle of a rollout worker::

    (empty slot) --BeginPlan add--> JOINING --WorkerReady--> ACTIVE
    (empty slot) --WorkerRegistered--> ACTIVE (started outside PEARL; held while unpaired)
    ACTIVE --BeginPlan switch--> SWITCHING --RoleSwitched--> ACTIVE (new role)
    ACTIVE/JOINING/SWITCHING --BeginPlan remove, GpusLeave, TrainBegin--> LEAVING
    LEAVING --WorkerLeft--> empty slot (dedicated) or INACTIVE (overlap: process kept)
    INACTIVE --BeginPlan add (retained)--> JOINING --ActivationAbandoned--> INACTIVE
    any --WorkerLost--> empty slot

When an update leaves active prefill workers without active decode workers (or the
reverse), those orphans are *held*: SWITCHING to their own role, out of routing, still
members, so the next plan can reassign them instead of relaunching (section 4.2). They
serve again once a counterpart is back (it registers, or its abandoned switch restores it).
Overlap ownership: TrainFinished hands the zone to rollout; TrainBegin sends every
overlap member LEAVING and the zone is RETURNING until the last one has left, then
TRAINING.  ``training_owns_overlap`` is what ``POST /train_begin`` waits for.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Union

from pearl_sglang.core.errors import InvalidTransition
from pearl_sglang.core.planner import Plan, WorkerAdd
from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone, check


@dataclass(frozen=True)
class GpusJoin:
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class GpusLeave:
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class TrainBegin:
    pass


@dataclass(frozen=True)
class TrainFinished:
    pass


@dataclass(frozen=True)
class BeginPlan:
    plan: Plan


@dataclass(frozen=True)
class WorkerReady:
    slot: int
    endpoint: str | None = None
    bootstrap_port: int | None = None
    weight_version: str | None = None


@dataclass(frozen=True)
class RoleSwitched:
    slot: int
    endpoint: str | None = None
    bootstrap_port: int | None = None
    weight_version: str | None = None  # what it loaded; None: what it held


@dataclass(frozen=True)
class SwitchAbandoned:
    """A switch given up with its failed group: the worker serves again in its old role."""

    slot: int
    endpoint: str | None = None
    bootstrap_port: int | None = None
    weight_version: str | None = None  # what it loaded; None: what it held


@dataclass(frozen=True)
class ActivationAbandoned:
    """A retained overlap worker's re-activation given up: its process stays, with its
    memory released (INACTIVE, as after its return)."""

    slot: int


@dataclass(frozen=True)
class WorkerLeft:
    slot: int


@dataclass(frozen=True)
class WorkerLost:
    """The worker's process is gone or had to be stopped (it crashed, could not release its
    memory, or could not go back to its old role): its slot empties. The router's
    ``WorkerFailed`` is another thing, one request's failure on a worker that may live on."""

    slot: int


@dataclass(frozen=True)
class WorkerRegistered:
    """A worker started outside PEARL (an RL framework's engine) joins on its own GPUs,
    already healthy and on the current weights. Its GPUs are opaque ids it brings along."""

    slot: int
    gpus: tuple[str, ...]
    role: Role
    endpoint: str
    bootstrap_port: int | None = None
    weight_version: str | None = None
    zone: Zone = Zone.DEDICATED


@dataclass(frozen=True)
class WorkerUnregistering:
    """A registered worker is being removed: out of routing, draining."""

    slot: int


@dataclass(frozen=True)
class WorkerUnregistered:
    """A registered worker is gone, with the GPU ids it brought."""

    slot: int


@dataclass(frozen=True)
class WeightsUpdated:
    slots: tuple[int, ...]
    version: str


Event = Union[GpusJoin, GpusLeave, TrainBegin, TrainFinished, BeginPlan, WorkerReady, RoleSwitched,
              SwitchAbandoned, ActivationAbandoned, WorkerLeft, WorkerLost, WeightsUpdated, WorkerRegistered,
              WorkerUnregistering, WorkerUnregistered]


# Events that can take workers out of routing.  Admissions are deliberately not here: a
# lone admitted prefill worker is a caller error and fails the invariant check instead.
_SHRINKING = (GpusLeave, TrainBegin, WorkerLost, BeginPlan, SwitchAbandoned, ActivationAbandoned,
              WorkerUnregistering, WorkerUnregistered)


def apply(table: StateTable, event: Event) -> StateTable:
    return apply_all(table, (event,))


def apply_all(table: StateTable, events: Iterable[Event]) -> StateTable:
    """Apply events in order; invariants are checked once on the final snapshot."""
    out = table
    for event in events:
        out = _step(out, event)
        if isinstance(event, _SHRINKING):
            out = _hold_orphans(out)
    out = replace(out, revision=table.revision + 1)
    return check(out)


def _step(t: StateTable, e: Event) -> StateTable:
    if isinstance(e, GpusJoin):
        return _gpus_join(t, e)
    if isinstance(e, GpusLeave):
        return _gpus_leave(t, e)
    if isinstance(e, TrainBegin):
        return _train_begin(t)
    if isinstance(e, TrainFinished):
        return _train_finished(t)
    if isinstance(e, BeginPlan):
        return _begin_plan(t, e.plan)
    if isinstance(e, WorkerReady):
        w = _expect(t, e.slot, Activity.JOINING)
        return t.put(replace(w, activity=Activity.ACTIVE, endpoint=e.endpoint or w.endpoint,
                             bootstrap_port=e.bootstrap_port if e.bootstrap_port is not None else w.bootstrap_port,
                             weight_version=e.weight_version or w.weight_version))
    if isinstance(e, RoleSwitched):
        w = _expect(t, e.slot, Activity.SWITCHING)
        return t.put(replace(w, role=w.pending_role, pending_role=None, activity=Activity.ACTIVE,
                             endpoint=e.endpoint or w.endpoint,
                             bootstrap_port=e.bootstrap_port if e.bootstrap_port is not None else w.bootstrap_port,
                             weight_version=e.weight_version or w.weight_version))
    if isinstance(e, SwitchAbandoned):
        w = _expect(t, e.slot, Activity.SWITCHING)
        return _release_held(t.put(replace(w, pending_role=None, activity=Activity.ACTIVE,
                                           endpoint=e.endpoint or w.endpoint,
                                           bootstrap_port=e.bootstrap_port if e.bootstrap_port is not None
                                           else w.bootstrap_port,
                                           weight_version=e.weight_version or w.weight_version)))
    if isinstance(e, ActivationAbandoned):
        w = _expect(t, e.slot, Activity.JOINING)
        if w.zone is not Zone.OVERLAP:
            raise InvalidTransition(f"slot {w.slot} is not a retained overlap worker", key="slot")
        return _settle_return(t.put(replace(w, activity=Activity.INACTIVE, pending_role=None)))
    if isinstance(e, WorkerLeft):
        w = _expect(t, e.slot, Activity.LEAVING)
        t = t.drop(w.slot) if w.zone is Zone.DEDICATED else t.put(replace(w, activity=Activity.INACTIVE))
        return _settle_return(t)
    if isinstance(e, WorkerLost):
        w = t.worker(e.slot)
        if not w.is_rollout:
            raise InvalidTransition(f"slot {w.slot} is a training worker; training failures are not rollout events")
        return _settle_return(t.drop(w.slot))
    if isinstance(e, WorkerRegistered):
        return _register(t, e)
    if isinstance(e, WorkerUnregistering):
        w = t.worker(e.slot)
        if not w.is_rollout:
            raise InvalidTransition(f"slot {w.slot} is a training worker", key="slot")
        return t.put(replace(w, activity=Activity.LEAVING, pending_role=None))
    if isinstance(e, WorkerUnregistered):
        w = t.worker(e.slot)
        if not w.is_rollout:
            raise InvalidTransition(f"slot {w.slot} is a training worker", key="slot")
        gone = frozenset(w.gpus)
        t = replace(t.drop(w.slot), dedicated_gpus=t.dedicated_gpus - gone, overlap_gpus=t.overlap_gpus - gone)
        return _settle_return(t)
    if isinstance(e, WeightsUpdated):
        for slot in e.slots:
            w = t.worker(slot)
            if not w.is_rollout:
                raise InvalidTransition(f"slot {slot} is a training worker")
            t = t.put(replace(w, weight_version=e.version))
        return t
    raise InvalidTransition(f"unknown event {e!r}")


def _expect(t: StateTable, slot: int, activity: Activity) -> WorkerRecord:
    w = t.worker(slot)
    if not w.is_rollout or w.activity is not activity:
        raise InvalidTransition(f"slot {slot} is {w.activity.value}, expected {activity.value}", key="slot")
    return w


def _gpus_join(t: StateTable, e: GpusJoin) -> StateTable:
    known = t.dedicated_gpus | t.overlap_gpus
    clash = sorted(set(e.gpus) & known)
    if clash or len(set(e.gpus)) != len(e.gpus):
        raise InvalidTransition(f"GPUs already known or repeated: {clash or list(e.gpus)}", key="gpus")
    return replace(t, dedicated_gpus=t.dedicated_gpus | frozenset(e.gpus))


def _gpus_leave(t: StateTable, e: GpusLeave) -> StateTable:
    gone = frozenset(e.gpus)
    unknown = sorted(gone - t.dedicated_gpus)
    if unknown:
        raise InvalidTransition(f"GPUs not in the dedicated zone: {unknown}", key="gpus")
    t = replace(t, dedicated_gpus=t.dedicated_gpus - gone)
    for w in t.rollout_workers():
        if gone & set(w.gpus) and w.activity is not Activity.LEAVING:
            t = t.put(replace(w, activity=Activity.LEAVING, pending_role=None))
    return t


def _train_begin(t: StateTable) -> StateTable:
    if t.overlap_owner is not OverlapOwner.ROLLOUT:
        raise InvalidTransition(f"train_begin while overlap owner is {t.overlap_owner.value}")
    t = replace(t, overlap_owner=OverlapOwner.RETURNING)
    for w in t.rollout_workers():
        if w.zone is Zone.OVERLAP and w.is_member:
            t = t.put(replace(w, activity=Activity.LEAVING, pending_role=None))
    return _settle_return(t)


def _settle_return(t: StateTable) -> StateTable:
    """RETURNING becomes TRAINING once no overlap rollout process is still draining."""
    if t.overlap_owner is not OverlapOwner.RETURNING:
        return t
    if any(w.zone is Zone.OVERLAP and w.activity is not Activity.INACTIVE for w in t.rollout_workers()):
        return t
    return _set_training_activity(replace(t, overlap_owner=OverlapOwner.TRAINING), Activity.ACTIVE)


def _train_finished(t: StateTable) -> StateTable:
    if t.overlap_owner is not OverlapOwner.TRAINING:
        raise InvalidTransition(f"train_finished while overlap owner is {t.overlap_owner.value}")
    return _set_training_activity(replace(t, overlap_owner=OverlapOwner.ROLLOUT), Activity.INACTIVE)


def _set_training_activity(t: StateTable, activity: Activity) -> StateTable:
    return t.with_workers(replace(w, activity=activity) if not w.is_rollout else w for w in t.workers)


def _begin_plan(t: StateTable, plan: Plan) -> StateTable:
    for slot in plan.remove:
        w = t.worker(slot)
        if not w.is_member:
            raise InvalidTransition(f"plan removes slot {slot}, which is {w.activity.value}", key="remove")
        t = t.put(replace(w, activity=Activity.LEAVING, pending_role=None))
    for change in plan.switch:
        w = t.worker(change.slot)
        if not w.is_member or w.intended_role is not change.old:
            raise InvalidTransition(f"plan switches slot {change.slot} from {change.old.value}, "
                                    f"but it is {w.activity.value} {w.intended_role.value}", key="switch")
        if w.activity is Activity.JOINING:
            t = t.put(replace(w, role=change.new))  # not serving yet: start in the new role
        else:
            t = t.put(replace(w, activity=Activity.SWITCHING, pending_role=change.new))
    for add in plan.add:
        t = _plan_add(t, add)
    return t


def _plan_add(t: StateTable, add: WorkerAdd) -> StateTable:
    if add.role is Role.TRAINING:
        raise InvalidTransition("plans never add training workers", key="add")
    if add.zone is Zone.OVERLAP and t.overlap_owner is not OverlapOwner.ROLLOUT:
        raise InvalidTransition(f"cannot add overlap worker in slot {add.slot}: "
                                f"overlap owner is {t.overlap_owner.value}", key="add")
    if add.retained:
        w = t.worker(add.slot)
        if w.activity is not Activity.INACTIVE or w.gpus != add.gpus:
            raise InvalidTransition(f"slot {add.slot} holds no matching retained process", key="add")
        return t.put(replace(w, role=add.role, activity=Activity.JOINING))
    if t.has(add.slot):
        raise InvalidTransition(f"plan adds slot {add.slot}, which is taken", key="add")
    zone_gpus = t.dedicated_gpus if add.zone is Zone.DEDICATED else t.overlap_gpus
    if not set(add.gpus) <= zone_gpus or set(add.gpus) & t.bound_gpus():
        raise InvalidTransition(f"plan adds slot {add.slot} on unavailable GPUs {list(add.gpus)}", key="add")
    return t.put(WorkerRecord(add.slot, add.gpus, add.zone, add.role, Activity.JOINING))


def _register(t: StateTable, e: WorkerRegistered) -> StateTable:
    """Admit a registered worker. A lone prefill (or decode) worker is held until its
    counterpart registers; then both, and any other held ones, serve together. An overlap
    worker (on training GPUs) serves only while rollout owns the zone; until then it is a
    retained, inactive process that PEARL activates when it borrows."""
    if e.role is Role.TRAINING:
        raise InvalidTransition("a registered worker serves rollout, not training", key="role")
    if t.has(e.slot):
        raise InvalidTransition(f"slot {e.slot} is taken", key="slot")
    clash = sorted(set(e.gpus) & (t.dedicated_gpus | t.overlap_gpus))
    if clash:
        raise InvalidTransition(f"GPUs already known: {clash}", key="gpus")
    if e.zone is Zone.OVERLAP:
        t = replace(t, overlap_gpus=t.overlap_gpus | frozenset(e.gpus))
        activity = Activity.ACTIVE if t.overlap_owner is OverlapOwner.ROLLOUT else Activity.INACTIVE
    else:
        t = replace(t, dedicated_gpus=t.dedicated_gpus | frozenset(e.gpus))
        activity = Activity.ACTIVE
    t = t.put(WorkerRecord(e.slot, e.gpus, e.zone, e.role, activity, endpoint=e.endpoint,
                           bootstrap_port=e.bootstrap_port, weight_version=e.weight_version))
    return _hold_orphans(_release_held(t))


def _release_held(t: StateTable) -> StateTable:
    """Held prefill or decode workers serve again once a counterpart serves or is held
    beside them: a pair whose switch was abandoned comes back one worker at a time, and
    the first one back is held until the second is."""
    held = [w for w in t.rollout_workers() if w.held]
    roles = {w.role for w in t.active()} | {w.role for w in held}
    if held and Role.PREFILL in roles and Role.DECODE in roles:
        for w in held:
            t = t.put(replace(w, activity=Activity.ACTIVE, pending_role=None))
    return t


def _hold_orphans(t: StateTable) -> StateTable:
    """Take a prefill pool without decode (or the reverse) out of routing, as members."""
    topo = t.active_topology()
    if (topo.prefill >= 1) == (topo.decode >= 1):
        return t
    lonely = Role.PREFILL if topo.prefill else Role.DECODE
    for w in t.active(lonely):
        t = t.put(replace(w, activity=Activity.SWITCHING, pending_role=w.role))
    return t
