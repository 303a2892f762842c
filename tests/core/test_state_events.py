"""State table and events: lifecycle, invariants, serialization, random event sequences."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl_sglang.core.errors import (
    CoreError,
    InfeasibleTarget,
    InvalidSnapshot,
    InvalidTransition,
    InvariantViolation,
    UnknownWorker,
)
from pearl_sglang.core.events import (
    BeginPlan,
    GpusJoin,
    GpusLeave,
    RoleSwitched,
    TrainBegin,
    TrainFinished,
    WeightsUpdated,
    WorkerLeft,
    WorkerLost,
    WorkerReady,
    apply,
    apply_all,
)
from pearl_sglang.core.planner import plan
from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone, violations
from pearl_sglang.core.topology import Topology

from tests.support.core_strategies import tables, valid_targets

P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED
DED = [f"node0:{i}" for i in range(8)]
OVL = [f"train0:{i}" for i in range(4)]


def _start(target=Topology.pd(1, 2)) -> StateTable:
    t = StateTable.create(tp_size=2, dedicated_gpus=DED, overlap_gpus=OVL,
                          workers=[WorkerRecord(10, ("train0:0", "train0:1", "train0:2", "train0:3"),
                                                Zone.OVERLAP, Role.TRAINING, Activity.ACTIVE)])
    t = apply(t, BeginPlan(plan(t, target)))
    return apply_all(t, [WorkerReady(w.slot, endpoint=f"http://w{w.slot}", weight_version="v0",
                                     bootstrap_port=9000 + w.slot if w.role is P else None)
                         for w in t.members()])


def test_admission_and_router_queries():
    t = _start()
    assert t.active_topology() == Topology.pd(1, 2)
    (prefill,) = t.active(P)
    assert prefill.endpoint == "http://w0" and prefill.bootstrap_port == 9000 and prefill.gpus == ("node0:0", "node0:1")
    assert [w.slot for w in t.active(D)] == [1, 2]
    assert t.training_owns_overlap and t.revision == 2


def test_lone_admission_is_rejected_but_group_admission_works():
    t = StateTable.create(tp_size=2, dedicated_gpus=DED)
    t = apply(t, BeginPlan(plan(t, Topology.pd(1, 1))))
    with pytest.raises(InvariantViolation):
        apply(t, WorkerReady(0))
    t2 = apply_all(t, [WorkerReady(0), WorkerReady(1)])
    assert t2.active_topology() == Topology.pd(1, 1)
    assert t.active_topology() == Topology()  # the old snapshot is untouched


def test_losing_last_prefill_holds_decoders_and_plan_reassigns_them():
    t = _start()
    t = apply(t, GpusLeave(("node0:0", "node0:1")))
    assert t.active() == ()
    assert t.worker(0).activity is Activity.LEAVING
    assert all(t.worker(s).held for s in (1, 2))
    assert t.topology() == Topology.pd(0, 2)
    p = plan(t, Topology.pd(1, 1), available=t.available_gpus() - {"node0:0", "node0:1"})
    assert p.change_count == 1 and p.d_role == 1 and not p.add  # one decoder becomes the prefill
    t = apply(t, BeginPlan(p))
    t = apply_all(t, [RoleSwitched(1), RoleSwitched(2)])
    assert t.active_topology() == Topology.pd(1, 1)
    t = apply(t, WorkerLeft(0))
    assert not t.has(0)
    # The freed slot is reused by the next new worker.
    t = apply(t, GpusJoin(("node1:0", "node1:1")))
    p = plan(t, Topology.pd(1, 2))
    assert [a.slot for a in p.add] == [0]


def test_borrow_and_return_overlap_workers():
    t = apply(_start(), TrainFinished())
    assert t.overlap_owner is OverlapOwner.ROLLOUT
    assert t.worker(10).activity is Activity.INACTIVE  # training worker idle
    p = plan(t, Topology.pd(2, 3))
    assert {a.zone for a in p.add} == {Zone.DEDICATED, Zone.OVERLAP}
    t = apply(t, BeginPlan(p))
    t = apply_all(t, [WorkerReady(a.slot) for a in p.add])
    overlap_slots = [w.slot for w in t.rollout_workers() if w.zone is Zone.OVERLAP]
    t = apply(t, TrainBegin())
    assert t.overlap_owner is OverlapOwner.RETURNING and not t.training_owns_overlap
    assert all(t.worker(s).activity is Activity.LEAVING for s in overlap_slots)
    for s in overlap_slots:
        t = apply(t, WorkerLeft(s))
    assert t.training_owns_overlap and t.worker(10).activity is Activity.ACTIVE
    assert all(t.worker(s).activity is Activity.INACTIVE for s in overlap_slots)  # processes retained
    # Next borrow resumes the retained processes instead of launching new ones.
    t = apply(t, TrainFinished())
    p2 = plan(t, Topology.pd(2, 3))
    assert all(a.retained for a in p2.add if a.zone is Zone.OVERLAP)


def test_illegal_transitions():
    t = _start()
    with pytest.raises(InvalidTransition):
        apply(t, TrainBegin())  # training already owns the overlap zone
    with pytest.raises(InvalidTransition):
        apply(t, WorkerLeft(0))  # not leaving
    with pytest.raises(UnknownWorker):
        apply(t, WorkerReady(42))
    with pytest.raises(InvalidTransition):
        apply(t, GpusJoin(("node0:0",)))  # already known
    with pytest.raises(InvalidTransition):
        apply(t, GpusLeave(("train0:0",)))  # not a dedicated GPU
    with pytest.raises(InvalidTransition):
        apply(t, BeginPlan(plan(apply(t, TrainFinished()), Topology.pd(2, 4))))  # overlap still training's


def test_invariants_catch_bad_tables():
    g = ("node0:0", "node0:1")
    with pytest.raises(InvariantViolation, match="two rollout"):
        StateTable.create(tp_size=2, dedicated_gpus=DED, workers=[
            WorkerRecord(0, g, Zone.DEDICATED, C, Activity.ACTIVE), WorkerRecord(1, g, Zone.DEDICATED, C, Activity.LEAVING)])
    with pytest.raises(InvariantViolation, match="owner is training"):
        StateTable.create(tp_size=2, overlap_gpus=OVL, workers=[
            WorkerRecord(0, ("train0:0", "train0:1"), Zone.OVERLAP, C, Activity.ACTIVE)])
    with pytest.raises(InvariantViolation, match="prefill pool without decode"):
        StateTable.create(tp_size=2, dedicated_gpus=DED, workers=[WorkerRecord(0, g, Zone.DEDICATED, P, Activity.ACTIVE)])
    # Colocated workers may serve beside a PD pair during a mode switch.
    StateTable.create(tp_size=2, dedicated_gpus=DED, workers=[
        WorkerRecord(0, g, Zone.DEDICATED, P, Activity.ACTIVE),
        WorkerRecord(1, ("node0:2", "node0:3"), Zone.DEDICATED, D, Activity.ACTIVE),
        WorkerRecord(2, ("node0:4", "node0:5"), Zone.DEDICATED, C, Activity.ACTIVE)])


def test_weights_and_serialization_round_trip():
    t = apply(_start(), WeightsUpdated((0, 1), "v1"))
    assert t.worker(0).weight_version == "v1" and t.worker(2).weight_version == "v0"
    data = json.loads(json.dumps(t.to_dict()))
    assert StateTable.from_dict(data) == t
    data["workers"][0]["activity"] = "dancing"
    with pytest.raises(InvalidSnapshot):
        StateTable.from_dict(data)


def _events(table: StateTable, data) -> list:
    """Events worth trying on ``table``: legal ones mostly, and some illegal ones."""
    options = [TrainBegin(), TrainFinished(),
               GpusJoin((f"new{table.revision}:0", f"new{table.revision}:1")[: table.tp_size])]
    if table.dedicated_gpus:
        options.append(GpusLeave(tuple(data.draw(st.sets(st.sampled_from(sorted(table.dedicated_gpus)), min_size=1)))))
    for w in table.rollout_workers():
        options += [WorkerReady(w.slot), RoleSwitched(w.slot), WorkerLeft(w.slot), WorkerLost(w.slot),
                    WeightsUpdated((w.slot,), "v")]
    joining = [w.slot for w in table.rollout_workers() if w.activity is Activity.JOINING]
    switching = [w.slot for w in table.rollout_workers() if w.activity is Activity.SWITCHING]
    options.append([WorkerReady(s) for s in joining] + [RoleSwitched(s) for s in switching])
    budget = table.budget()
    if budget:
        try:
            options.append(BeginPlan(plan(table, data.draw(valid_targets(budget)))))
        except InfeasibleTarget:
            pass
    return options


def _must_succeed(table: StateTable, event) -> bool:
    """Events the control plane relies on: reclaims, returns, failures and fresh plans
    are never refused, whatever state the table is in."""
    if isinstance(event, (GpusJoin, GpusLeave, BeginPlan, WeightsUpdated, WorkerLost)):
        return True
    if isinstance(event, TrainBegin):
        return table.overlap_owner is OverlapOwner.ROLLOUT
    if isinstance(event, TrainFinished):
        return table.overlap_owner is OverlapOwner.TRAINING
    if isinstance(event, WorkerLeft):
        return table.worker(event.slot).activity is Activity.LEAVING
    return False


@settings(deadline=None, max_examples=100)
@given(tables(max_groups=6), st.data())
def test_invariants_hold_after_any_event_sequence(table, data):
    for _ in range(data.draw(st.integers(1, 25))):
        event = data.draw(st.sampled_from(_events(table, data)))
        before = table.to_dict()
        try:
            table = apply_all(table, event) if isinstance(event, list) else apply(table, event)
        except CoreError:
            assert isinstance(event, list) or not _must_succeed(table, event)
            assert table.to_dict() == before  # a rejected event changes nothing
            continue
        assert violations(table) == []
        assert StateTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table
