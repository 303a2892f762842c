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


def test_planned_pause_keeps_probe_failures_from_opening_the_circuit():
    from pearl_sglang.router.health import CircuitBreakers

    breakers = CircuitBreakers(failures_to_open=2, cooldown_s=30)
    with breakers.planned_pause([3]):
        assert breakers.paused(3) and not breakers.paused(4)
    assert not breakers.paused(3)
    breakers.failure(4, now=0.0)
    breakers.failure(4, now=1.0)
    assert breakers.open_slots(now=2.0) == {4} and breakers.open_slots(now=40.0) == set()
    breakers.success(4)
    assert breakers.open_slots(now=2.0) == set()
