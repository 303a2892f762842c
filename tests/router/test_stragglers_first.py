"""Stragglers first in the router itself: requests it holds are released in priority
order, finished trajectories drop out of the critical path, and the tail view names where
the stragglers run (what isolation places around)."""
from __future__ import annotations

import asyncio

import pytest

from pearl_sglang.router.admission import AdmissionGate
from pearl_sglang.router.errors import ServiceUnavailable
from pearl_sglang.router.telemetry import TelemetryCollector, TurnObservation


async def test_held_requests_are_released_by_priority_then_arrival():
    gate = AdmissionGate()
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        await gate.admit(priority)
        order.append(name)

    async with gate.closed("adding workers"):
        tasks = [asyncio.create_task(request(n, p)) for n, p in (("a", 0), ("b", 1), ("c", 0), ("d", 5))]
        while gate.waiting < 4:
            await asyncio.sleep(0)
        assert not order
    await asyncio.gather(*tasks)
    assert order == ["d", "b", "a", "c"]
    assert gate.waiting == 0 and gate.is_open


async def test_a_waiter_that_gives_up_does_not_block_the_others():
    gate = AdmissionGate(wait_timeout_s=0.05)
    async with gate.closed("slow"):
        with pytest.raises(ServiceUnavailable, match="admission paused"):
            await gate.admit(3)
        gate.wait_timeout_s = 5.0
        late = asyncio.create_task(gate.admit(0))
        cancelled = asyncio.create_task(gate.admit(9))
        while gate.waiting < 2:
            await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
    await asyncio.wait_for(late, 1.0)
    assert gate.waiting == 0


def _turn(col: TelemetryCollector, tid: str, start: float, end: float, slot: int, turn: int) -> None:
    col.turn_began(tid, start)
    col.observe(TurnObservation(trajectory=tid, turn=turn, key=(), full_key=(), prompt_tokens=100,
                                cached_tokens=0, generated_tokens=10, arrived_at=start, first_chunk_at=start,
                                finished_at=end, first_chunk_tokens=16))
    col.turn_left(tid, slot, end)


def test_a_finished_trajectory_is_not_a_straggler_and_the_tail_names_where_they_run():
    col = TelemetryCollector(idle_s=30.0)
    for i in range(4):  # the last step: every trajectory took ten turns
        for k in range(10):
            _turn(col, f"old-{i}", 10.0 * k, 10.0 * k + 5, 0, k)
    col.drain()
    # "short" did two turns long ago and never came back: finished. "slow" did two turns
    # too but is in a turn now; the others are further along and between turns.
    _turn(col, "short", 0, 5, 1, 0)
    _turn(col, "short", 10, 15, 1, 1)
    _turn(col, "slow", 0, 5, 2, 0)
    _turn(col, "slow", 10, 15, 2, 1)
    col.turn_began("slow", 90)
    for tid, slot in (("a", 3), ("b", 3)):
        for k in range(8):
            _turn(col, tid, 12.0 * k, 12.0 * k + 6, slot, k)
    now = 100.0
    assert set(col.live(now)) == {"slow", "a", "b"}
    assert col.finished_share(now) == pytest.approx(0.25)
    view = col.tail(now, share=0.3)
    assert view.stragglers == frozenset({"slow"})  # "short" expects 8 more turns but is done
    assert view.stragglers_on == {2: 1} and view.finished_share == pytest.approx(0.25)
    assert col.is_straggler("slow", now, share=0.3) and not col.is_straggler("short", now, share=0.3)


def _table(lent: bool):
    from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone
    return StateTable.create(
        tp_size=1, dedicated_gpus=["g0"], overlap_gpus=["g1"],
        overlap_owner=OverlapOwner.ROLLOUT if lent else OverlapOwner.TRAINING,
        workers=[WorkerRecord(0, ("g0",), Zone.DEDICATED, Role.COLOCATED, Activity.ACTIVE),
                 WorkerRecord(1, ("g1",), Zone.OVERLAP, Role.COLOCATED,
                              Activity.ACTIVE if lent else Activity.INACTIVE)])


def test_isolation_scoped_to_borrowed_gpus_applies_only_while_they_serve():
    """``--straggler-isolation-scope borrowed``: the tail's isolation holds while a worker on
    lent training GPUs serves rollout, and placement is the policy's own otherwise."""
    from pearl_sglang.core.straggler_isolation import IsolationConfig
    from pearl_sglang.router.stragglers import borrowed_serving, isolation_for

    col = TelemetryCollector(idle_s=30.0)
    for k in range(10):  # the last step: ten turns
        _turn(col, "old", 10.0 * k, 10.0 * k + 5, 0, k)
    col.drain()
    _turn(col, "done", 0, 5, 0, 0)  # never came back: the tail has begun
    _turn(col, "slow", 0, 5, 1, 0)
    col.turn_began("slow", 90)
    tables = {"now": _table(lent=False)}
    config = IsolationConfig(tail_share=0.2)
    scoped = isolation_for(col, share=0.5, config=config, when=borrowed_serving(lambda: tables["now"]))
    always = isolation_for(col, share=0.5, config=config)
    assert always("slow", 100.0).straggler
    assert scoped("slow", 100.0) is None  # the training GPUs are training
    tables["now"] = _table(lent=True)
    assert scoped("slow", 100.0) == always("slow", 100.0)
    assert scoped("slow", 100.0).straggler and scoped(None, 100.0) is None
    tables["now"] = _table(lent=False)  # handed back: placement is the policy's own again
    assert scoped("slow", 100.0) is None


def test_the_isolation_scope_is_a_flag_and_a_wrong_one_is_refused():
    import argparse

    from pearl_sglang.router.config import RouterConfig

    parser = argparse.ArgumentParser()
    RouterConfig.add_cli_args(parser)
    config = RouterConfig.from_cli_args(parser.parse_args(
        ["--straggler-isolation", "--straggler-isolation-scope", "borrowed"]))
    assert config.straggler_isolation and config.straggler_isolation_scope == "borrowed"
    assert RouterConfig.from_cli_args(parser.parse_args([])).straggler_isolation_scope == "always"
    with pytest.raises(SystemExit):
        parser.parse_args(["--straggler-isolation-scope", "sometimes"])
    with pytest.raises(ValueError, match="straggler-isolation-scope"):
        RouterConfig(straggler_isolation_scope="sometimes").validate()
