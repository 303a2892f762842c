from pearl_sglang.router.inflight import InFlightRegistry


def test_per_slot_counts_follow_attempts():
    reg = InFlightRegistry()
    a, b = reg.open("a"), reg.open("b")
    reg.assign(a, (0, 1), ("http://p", "http://d"))
    reg.assign(b, (1,), ("http://d",))
    assert reg.load() == {0: 1, 1: 2}
    reg.assign(a, (2,), ("http://c",))  # migrated
    assert reg.load() == {1: 1, 2: 1}
    assert [e.rid for e in reg.on_slot(1)] == ["b"] and reg.on_slot(0) == []
    reg.close("a")
    reg.close("b")
    reg.close("b")
    assert reg.load() == {} and len(reg) == 0
    assert [e.rid for e in reg.matching(None)] == []
