"""Staged colocated <-> PD changes (core/waves.py): a serving path of the old topology
stays up while the first new workers start, when one can; the waves reach the target."""
import itertools
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pearl_sglang.core.errors import InfeasibleTarget, InvariantViolation
from pearl_sglang.core.events import BeginPlan, RoleSwitched, SwitchAbandoned, WorkerLeft, WorkerReady, apply, apply_all
from pearl_sglang.core.planner import plan
from pearl_sglang.core.state import Activity, Role, StateTable, WorkerRecord, Zone
from pearl_sglang.core.topology import Topology
from pearl_sglang.core.waves import Wave, first_wave

from tests.support.core_strategies import tables, valid_targets

P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED


def _table(roles, free=0):
    workers = [WorkerRecord(i, (f"n0:{i}",), Zone.DEDICATED, r, Activity.ACTIVE, endpoint=f"http://w{i}")
               for i, r in enumerate(roles)]
    return StateTable.create(tp_size=1, dedicated_gpus={f"n0:{i}" for i in range(len(roles) + free)},
                             overlap_gpus=set(), workers=workers)


def _servable(topo: Topology) -> bool:
    return topo.total > 0 and (topo.prefill >= 1) == (topo.decode >= 1)


def _finish(table: StateTable, wave) -> StateTable:
    """Every change of the begun wave succeeds, as the control plane admits it: leaving
    workers go, then the wave's switches and additions are admitted together (workers
    held because their relaunch was deferred stay held). Joining workers the plan kept
    (left by a generated table) get ready too."""
    deferred = {c.slot for c in wave.deferred}
    leaving = [WorkerLeft(w.slot) for w in table.rollout_workers() if w.activity is Activity.LEAVING]
    if leaving:
        table = apply_all(table, leaving)
    events = [RoleSwitched(w.slot, endpoint=f"http://new{w.slot}") for w in table.rollout_workers()
              if w.activity is Activity.SWITCHING and w.slot not in deferred]
    events += [WorkerReady(w.slot, endpoint=f"http://new{w.slot}") for w in table.rollout_workers()
               if w.activity is Activity.JOINING]
    return apply_all(table, events) if events else table


def _run(table: StateTable, target: Topology):
    """All waves to ``target``: (serving topology while each wave runs, wave) pairs."""
    seen = []
    for _ in range(table.budget() + 3):
        p = plan(table, target)
        if p.is_empty:
            return table, seen
        wave = first_wave(table, p)
        table = apply(table, BeginPlan(wave.plan))
        seen.append((table.active_topology(), wave))
        table = _finish(table, wave)
    raise AssertionError(f"no end after {len(seen)} waves: {[w.to_dict() for _, w in seen]}")


@pytest.mark.parametrize("start, target, waves, during", [
    ([C, C, C, C], Topology.pd(2, 2), 2, ["2C", "1P1D"]),
    ([P, P, D, D], Topology.coloc(4), 2, ["1P1D", "2C"]),
    ([C, C, C], Topology.pd(1, 2), 2, ["1C", "1P1D"]),
    ([P, D, D], Topology.coloc(3), 2, ["1P1D", "1C"]),
])
def test_a_serving_path_of_the_old_topology_stays_up(start, target, waves, during):
    end, seen = _run(_table(start), target)
    assert end.active_topology() == target
    assert len(seen) == waves and all(w.keeps_serving for _, w in seen)
    assert [t.label() for t, _ in seen] == during
    assert seen[0][1].staged and not seen[-1][1].staged


def test_when_no_old_path_can_be_kept_the_fewest_relaunch_first_and_it_says_so():
    end, seen = _run(_table([P, D]), Topology.coloc(2))
    assert end.active_topology() == Topology.coloc(2)
    first = seen[0][1]
    assert not first.keeps_serving and len(first.plan.switch) == 1 and len(first.deferred) == 1
    assert seen[0][0].total == 0  # the decode worker is held while the first colocated one starts
    assert seen[1][0] == Topology.coloc(1)  # then that one serves while the last relaunches
    end, seen = _run(_table([C, C]), Topology.pd(1, 1))  # a pair needs both: one wave
    assert len(seen) == 1 and not seen[0][1].keeps_serving and end.active_topology() == Topology.pd(1, 1)


def test_prefill_decode_changes_and_additions_are_never_deferred():
    assert not first_wave(_table([P, D, D]), plan(_table([P, D, D]), Topology.pd(2, 1))).staged
    t = _table([C, C], free=2)
    wave = first_wave(t, plan(t, Topology.pd(2, 2)))
    assert len(wave.plan.add) == 2 and wave.keeps_serving


def test_an_abandoned_pair_switch_serves_again_once_both_are_back():
    t = apply(_table([P, D]), BeginPlan(plan(_table([P, D]), Topology.coloc(2))))
    back = apply_all(t, [SwitchAbandoned(0), SwitchAbandoned(1)])
    assert back.active_topology() == Topology.pd(1, 1)


def _keeps_path(table, p, subset) -> bool:
    """Whether beginning ``p`` with only ``subset`` of its deferrable relaunches keeps an
    old serving path up meanwhile, and admitting them then serves without breaking an
    invariant."""
    chosen = set(subset)
    deferred = tuple(c for c in p.switch if c not in chosen and _deferrable(table, p, c))
    keep = tuple(sorted(p.keep + tuple((c.slot, c.old) for c in deferred)))
    sub = replace(p, switch=tuple(c for c in p.switch if c not in deferred), keep=keep)
    try:
        begun = apply(table, BeginPlan(sub))
        done = _finish(begun, Wave(sub, deferred))
    except InvariantViolation:
        return False
    return _servable(begun.active_topology()) and _servable(done.active_topology())


def _deferrable(table, p, c) -> bool:
    w = table.worker(c.slot)
    return (w.activity is Activity.ACTIVE and c.slot not in p.remove
            and {c.old, c.new} != {P, D})


@settings(deadline=None, max_examples=120)
@given(tables(max_groups=7), st.data())
def test_waves_partition_the_plan_keep_serving_when_possible_and_reach_the_target(table, data):
    target = data.draw(valid_targets(max(1, table.budget())))
    try:
        p = plan(table, target)
    except InfeasibleTarget:
        return
    # The control plane joins workers only through a plan's additions; a generated table can
    # hold a joining worker no plan activates (a prefill with no decode to pair with).
    added = {a.slot for a in p.add}
    assume(all(w.slot in added for w in table.rollout_workers() if w.activity is Activity.JOINING))
    wave = first_wave(table, p)
    # 1. Part of the plan.
    assert wave.plan.add == p.add and wave.plan.remove == p.remove
    assert set(wave.plan.switch) | set(wave.deferred) == set(p.switch)
    assert not set(wave.plan.switch) & set(wave.deferred)
    assert all(_deferrable(table, p, c) for c in wave.deferred)
    assert p.is_empty or wave.plan.change_count >= 1
    # 2. Feasible: begun and admitted without breaking an invariant; a staged wave serves.
    begun = apply(table, BeginPlan(wave.plan))
    done = _finish(begun, wave)
    if wave.staged:
        assert _servable(done.active_topology()), (table.to_dict(), wave.to_dict())
    # 3. A serving old path is kept whenever some split keeps one.
    if wave.keeps_serving and wave.staged:
        assert _servable(begun.active_topology())
    deferrable = [c for c in p.switch if _deferrable(table, p, c)]
    if len(deferrable) <= 6 and _servable(table.active_topology()):
        possible = any(_keeps_path(table, p, s)
                       for n in range(1, len(deferrable) + 1) for s in itertools.combinations(deferrable, n))
        if possible and not wave.keeps_serving:
            raise AssertionError(f"a split keeps serving but the wave does not: {wave.to_dict()}")
    # 4. The waves reach the target.
    end, _ = _run(table, target)
    assert end.topology() == target
