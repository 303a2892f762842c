"""Minimal-change planner: equations (5)/(6), brute-force minimality, cheap tie-breaks."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl_sglang.core.errors import InfeasibleTarget, InvalidConfig
from pearl_sglang.core.events import BeginPlan, apply
from pearl_sglang.core.planner import ChangeCosts, Plan, plan
from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone
from pearl_sglang.core.topology import Topology

from tests.support.core_strategies import tables, valid_targets

P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED


def _table(roles, *, free=0, overlap_inactive=(), owner=OverlapOwner.ROLLOUT):
    workers = [WorkerRecord(i, (f"n0:{i}",), Zone.DEDICATED, r, Activity.ACTIVE) for i, r in enumerate(roles)]
    dedicated = {f"n0:{i}" for i in range(len(roles) + free)}
    overlap = set()
    for j, r in enumerate(overlap_inactive):
        g = f"n1:{j}"
        overlap.add(g)
        workers.append(WorkerRecord(100 + j, (g,), Zone.OVERLAP, r, Activity.INACTIVE))
    return StateTable.create(tp_size=1, dedicated_gpus=dedicated, overlap_gpus=overlap, overlap_owner=owner,
                             workers=workers)


def test_keeps_roles_and_counts_changes_like_equations_5_and_6():
    t = _table([P, P, D, D, D])
    p = plan(t, Topology.pd(1, 4))
    assert p.d_worker == 0 and p.d_role == 1 and p.change_count == 1
    assert [(c.old, c.new) for c in p.switch] == [(P, D)]
    assert p.rho() == {0: P, 1: D, 2: D, 3: D, 4: D} or p.rho() == {0: D, 1: P, 2: D, 3: D, 4: D}


def test_growth_adds_in_lowest_free_slots_without_renumbering():
    t = _table([P, D], free=2)
    p = plan(t, Topology.pd(2, 2))
    assert p.remove == () and p.switch == ()
    assert [(a.slot, a.role) for a in p.add] in ([(2, P), (3, D)], [(2, D), (3, P)])
    assert dict(p.keep) == {0: P, 1: D}


def test_prefers_pd_switch_over_relaunch():
    # One excess prefill and one excess colocated; one decode deficit.  Both plans have
    # two changes (a switch and a removal); switching P->D in place is the cheap one.
    t = StateTable.create(
        tp_size=1, dedicated_gpus={"a:0", "a:1", "a:2"},
        workers=[WorkerRecord(0, ("a:0",), Zone.DEDICATED, P, Activity.SWITCHING, pending_role=P),
                 WorkerRecord(1, ("a:1",), Zone.DEDICATED, P, Activity.JOINING),
                 WorkerRecord(2, ("a:2",), Zone.DEDICATED, C, Activity.ACTIVE)])
    p = plan(t, Topology.pd(1, 1))
    assert p.change_count == 2
    assert [(c.old, c.new) for c in p.switch] == [(P, D)]
    assert p.remove == (2,)


def test_prefers_retained_process_with_matching_role():
    t = _table([P, D], free=1, overlap_inactive=[P, D])
    p = plan(t, Topology.pd(1, 2))
    assert len(p.add) == 1 and p.add[0].retained and p.add[0].role is D and p.add[0].slot == 101
    assert p.cost == ChangeCosts().activate_retained


def test_unavailable_gpus_force_removal():
    t = _table([P, D, D], free=1)
    p = plan(t, Topology.pd(1, 2), available=t.available_gpus() - {"n0:0"})
    assert 0 in p.remove and any(a.role is P for a in p.add) and p.change_count == 2


def test_infeasible_and_invalid_targets():
    t = _table([P, D])
    with pytest.raises(InfeasibleTarget):
        plan(t, Topology.pd(2, 2))
    with pytest.raises(InvalidConfig):
        plan(t, Topology(prefill=1))


def test_plan_round_trip():
    t = _table([P, D, C], free=2)
    p = plan(t, Topology.pd(2, 3))
    assert Plan.from_dict(p.to_dict()) == p


def _brute_force(table: StateTable, target: Topology, pool: frozenset) -> int | None:
    members = table.members()
    units = [("member", w) for w in members]
    units += [("retained", w) for w in table.rollout_workers()
              if w.activity is Activity.INACTIVE and set(w.gpus) <= pool]
    units += [("free", g) for g in table.free_gpu_groups(pool)]
    want = (target.prefill, target.decode, target.colocated)
    best = None
    for choice in itertools.product((None, P, D, C), repeat=len(units)):
        if (choice.count(P), choice.count(D), choice.count(C)) != want:
            continue
        changes = 0
        ok = True
        for (kind, w), r in zip(units, choice):
            if kind == "member":
                if r is None:
                    changes += 1
                elif not set(w.gpus) <= pool:
                    ok = False
                    break
                elif r is not w.intended_role:
                    changes += 1
            elif r is not None:
                changes += 1
        if ok and (best is None or changes < best):
            best = changes
    return best


@settings(deadline=None, max_examples=200)
@given(tables(max_groups=8), st.data())
def test_change_count_equals_brute_force_minimum(table, data):
    groups = sorted({w.gpus for w in table.rollout_workers()} | {g for _, g in table.free_gpu_groups()})
    dropped = data.draw(st.sets(st.sampled_from(groups)) if groups else st.just(set()))
    pool = table.available_gpus() - {g for grp in dropped for g in grp}
    placeable = table.budget(pool)
    # Mostly reachable targets, sometimes too large ones (the planner must refuse those).
    target = data.draw(valid_targets(max(1, placeable)) | valid_targets(8))
    expected = _brute_force(table, target, pool)
    if expected is None:
        with pytest.raises(InfeasibleTarget):
            plan(table, target, available=pool)
        return
    p = plan(table, target, available=pool)
    assert p.change_count == expected
    # Equations (5) and (6) on the plan's own W and W'.
    members = {w.slot: w for w in table.members()}
    w_new = set(p.rho()) | {a.slot for a in p.add}
    d_worker = len(w_new - set(members)) + len(set(members) - w_new)
    src = [members[s].intended_role for s in set(members) & w_new]
    dst = [p.rho()[s] for s in set(members) & w_new]
    d_role = sum(src.count(r) - min(src.count(r), dst.count(r)) for r in (P, D, C))
    assert (p.d_worker, p.d_role) == (d_worker, d_role)


@settings(deadline=None, max_examples=80)
@given(tables(max_groups=8), st.data())
def test_applying_a_plan_heads_the_table_to_the_target(table, data):
    target = data.draw(valid_targets(max(1, table.budget())))
    try:
        p = plan(table, target)
    except InfeasibleTarget:
        return
    after = apply(table, BeginPlan(p))
    assert after.topology() == target
    # Survivors never move: every kept slot still holds the same GPUs.
    for slot, _ in p.keep:
        assert after.worker(slot).gpus == table.worker(slot).gpus
