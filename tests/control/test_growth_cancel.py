"""A growth that an event cancels ends, also when the cancellation was swallowed on its
way (Python 3.11's ``asyncio.wait_for`` returns its inner result when both arrive
together): before waiting for the lock that its canceller holds, it ends itself. Before,
the two waited for each other and every later admin call hung (the burst fault test,
rarely, under load)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from pearl_sglang.aio import raise_if_cancelling
from pearl_sglang.control.cluster_config import RecoveryConfig
from pearl_sglang.control.growth import Growths
from pearl_sglang.core.state import StateTable


@dataclass
class Shell:
    """The planning shell: its lock, and a next wave that waits for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(borrowing=False, training=False))
    next_waves: int = 0

    def on(self, event):
        return ()

    async def next_wave(self, done, operation):
        async with self.lock:
            self.next_waves += 1
            return done


class Executor:
    def __init__(self) -> None:
        self.store = SimpleNamespace(table=StateTable.create(tp_size=1, dedicated_gpus=["d0:0"]))

    async def cancel_group(self, slots, reached=None) -> None:
        pass

    async def drop_dead_switches(self) -> None:
        pass


STAGED = SimpleNamespace(staged=True, keeps_serving=True, to_dict=lambda: {})


@pytest.mark.timeout(30)
async def test_a_growth_that_swallowed_its_cancellation_ends_before_the_cancellers_lock():
    shell = Shell()
    growths = Growths(shell=shell, executor=Executor(), weights=None, recovery=RecoveryConfig())
    entered = asyncio.Event()

    async def grow_swallowing_the_cancel(wave, operation):
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as asyncio.wait_for does when its inner call ends at the same time
        return [7]

    growths._grow = grow_swallowing_the_cancel
    expansion = growths.start(STAGED, "test")
    await entered.wait()
    async with shell.lock:  # an event re-plans: it holds the lock while the growth ends
        await asyncio.wait_for(growths.cancel(by="event"), 10)
    assert expansion.task.cancelled() and expansion.superseded_by == "event"
    assert shell.next_waves == 0 and growths.current is None


async def test_raise_if_cancelling_raises_only_in_a_task_asked_to_cancel():
    raise_if_cancelling()  # not asked: nothing
    reached = []

    async def swallowing():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
        reached.append("after the swallow")
        raise_if_cancelling()
        reached.append("never")

    task = asyncio.ensure_future(swallowing())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and reached == ["after the swallow"]
