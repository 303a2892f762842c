"""The trace replayer at the end of a replay: joins still waiting for admission end with
it, before the client they use closes, and are not counted as wrong answers."""
from __future__ import annotations

import asyncio

from pearl_rl_adapter import PearlError
from pearl_sglang.aio import cancelled_at_exit
from pearl_sglang.demo.replay import TraceReplayer
from pearl_sglang.workload.timebase import EmulatedTime
from pearl_sglang.workload.trace import WorkerTarget


class SlowAdmissions:
    """A client whose joins wait for admission until it is closed, then fail as a closed
    client's calls do."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.joins: list[list[str]] = []

    async def __aenter__(self) -> "SlowAdmissions":
        return self

    async def __aexit__(self, *exc) -> None:
        self.closed.set()

    async def join_gpus(self, gpus):
        self.joins.append(gpus)
        await self.closed.wait()
        raise PearlError("client is closed")


async def test_a_join_waiting_when_the_replay_ends_is_cancelled_not_wrong():
    """Its last change issued, the replayer waits for the answers of its joins."""
    client = SlowAdmissions()
    replayer = TraceReplayer(client, [WorkerTarget(0.0, 2)], EmulatedTime(time_scale=1000.0))
    run = asyncio.ensure_future(replayer.run())
    while len(client.joins) < 2:
        await asyncio.sleep(0)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    assert run.cancelled() and all(task.cancelled() for _, task in replayer.joined)
    client.closed.set()  # the client closes after the replay: nothing is left to fail
    await asyncio.sleep(0)
    assert replayer.answers.wrong == [] and replayer.answers.joins == 0


async def test_the_replays_block_cancels_its_tasks_before_the_client_closes():
    """As the replay harness and the demo hold them: ``async with client, cancelled_at_exit``."""
    tasks: list[asyncio.Future] = []
    async with SlowAdmissions() as client, cancelled_at_exit(tasks):
        replayer = TraceReplayer(client, [WorkerTarget(0.0, 1), WorkerTarget(3600.0, 2)],
                                 EmulatedTime(time_scale=1.0))
        tasks.append(asyncio.ensure_future(replayer.run()))
        while not client.joins:
            await asyncio.sleep(0)
    assert client.closed.is_set() and all(t.cancelled() for t in tasks)
    await asyncio.sleep(0)
    assert replayer.answers.wrong == []
