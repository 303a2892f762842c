"""Pure parts of registration: the table events and the relaunch lock."""
from __future__ import annotations

import pytest

from pearl_sglang.control.registration import Capabilities, capabilities
from pearl_sglang.core.registered import locked_pd_mode, relaunch_lock
from pearl_sglang.core.errors import CoreError
from pearl_sglang.core.events import (
    TrainFinished, WorkerRegistered, WorkerUnregistered, WorkerUnregistering, apply, apply_all,
)
from pearl_sglang.core.state import Activity, Role, StateTable, Zone


def _reg(slot, role=Role.COLOCATED, zone=Zone.DEDICATED):
    return WorkerRegistered(slot=slot, gpus=(f"registered-{slot}:0",), role=role, endpoint=f"http://w{slot}",
                            zone=zone)


def test_overlap_worker_is_retained_while_training_owns_the_zone_and_leaves_with_its_gpus():
    t = apply(StateTable.create(tp_size=1, dedicated_gpus=["d:0"]), _reg(0, zone=Zone.OVERLAP))
    w = t.worker(0)
    assert (w.zone, w.activity) == (Zone.OVERLAP, Activity.INACTIVE) and "registered-0:0" in t.overlap_gpus
    t = apply(t, TrainFinished())
    t2 = apply(t, _reg(1, zone=Zone.OVERLAP))
    assert t2.worker(1).activity is Activity.ACTIVE
    t3 = apply_all(t2, [WorkerUnregistering(1), WorkerUnregistered(1)])
    assert not t3.has(1) and "registered-1:0" not in t3.overlap_gpus


def test_lone_prefill_is_held_until_a_decode_registers_and_gpus_never_clash():
    t = apply(StateTable.create(tp_size=1), _reg(0, Role.PREFILL))
    assert t.worker(0).held and not t.active()
    t = apply(t, _reg(1, Role.DECODE))
    assert t.active_topology().label() == "1P1D"
    with pytest.raises(CoreError):
        apply(t, WorkerRegistered(slot=2, gpus=("registered-0:0",), role=Role.DECODE, endpoint="http://x"))
    t = apply(t, WorkerUnregistering(1))
    assert t.worker(0).held  # its partner is leaving: out of routing again


def test_relaunch_lock_keeps_the_mode_of_registered_workers():
    assert relaunch_lock(StateTable.create(tp_size=1)) is None
    pd = apply_all(StateTable.create(tp_size=1), [_reg(0, Role.PREFILL), _reg(1, Role.DECODE)])
    lock = relaunch_lock(pd)
    assert lock.pd_mode == "disaggregated" and "cannot be relaunched" in lock.reason
    assert [locked_pd_mode(m, lock) for m in ("auto", "colocated", "disaggregated", "3:5")] == \
        ["disaggregated", "disaggregated", "disaggregated", "3:5"]
    colocated = relaunch_lock(apply(StateTable.create(tp_size=1), _reg(0)))
    assert [locked_pd_mode(m, colocated) for m in ("auto", "disaggregated", "1:1")] == ["colocated"] * 3
    assert locked_pd_mode("auto", None) == "auto"


def test_the_engines_own_memory_saver_report_outranks_the_registration():
    none, claim = Capabilities(), Capabilities(memory_saver=True, pd_role_switch=False)
    assert capabilities(none, {"enable_memory_saver": True}).memory_saver is True
    assert capabilities(none, {}).memory_saver is False
    assert capabilities(claim, {}).memory_saver is True  # an engine that does not say: the claim holds
    assert capabilities(claim, {"enable_memory_saver": False}).memory_saver is False
    assert capabilities(claim, {"enable_pd_role_switch": True}).pd_role_switch is False
