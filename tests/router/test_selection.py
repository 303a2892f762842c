"""The routing core's learned prefix affinity: the last server of a block owns it, the
most recently used blocks survive eviction, an explicit trajectory id wins."""
from __future__ import annotations

from pearl_sglang.core.state import Activity, Role, WorkerRecord, Zone
from pearl_sglang.router.selection import SelectionPolicy, Selector, Target


def _on(slot: int) -> Target:
    return Target(worker=WorkerRecord(slot=slot, gpus=(f"n0:{slot}",), zone=Zone.DEDICATED,
                                      role=Role.COLOCATED, activity=Activity.ACTIVE))


def test_the_last_server_of_a_prefix_holds_it():
    sel = Selector()
    sel.remember(_on(1), (10, 11, 12))
    sel.remember(_on(2), (10, 11))            # a shorter shared prefix moves to worker 2
    assert sel.holder((10, 11, 12, 13)) == 1  # the longest known block decides
    assert sel.holder((10, 11)) == 2
    assert sel.holder((99,)) is None
    sel.remember(_on(3), (10,), trajectory="t")
    assert sel.holder((10, 11, 12), trajectory="t") == 3


def test_eviction_drops_the_least_recently_used_blocks():
    sel = Selector(SelectionPolicy(max_prefix_blocks=4))
    sel.remember(_on(1), (1, 2, 3))
    sel.remember(_on(2), (4, 5))    # 5 blocks: block 1 goes
    assert sel.holder((1,)) is None and sel.holder((2,)) == 1
    sel.remember(_on(3), (2, 6))    # 2 is refreshed, so 3 goes, not 2
    assert [sel.holder((b,)) for b in (2, 3, 4, 5, 6)] == [3, None, 2, 2, 3]
    sel.remember(_on(1), tuple(range(100, 110)))  # more than the limit: only its last four stay
    assert [sel.holder((b,)) for b in (5, 105, 106, 109)] == [None, None, 1, 1]
