"""``training_step()``: train_begin before, train_finished after, whatever the body does."""
from __future__ import annotations

import asyncio

import pytest

from pearl_rl_adapter import PearlConflict, PearlUnavailable


class UpdateFailed(Exception):
    pass


def test_sync_brackets_the_body(client, fake):
    with client.training_step(3) as begun:
        assert fake.order() == ["/train_begin:3"] and begun.returned_gpus == ("node1:0",)
    assert fake.order() == ["/train_begin:3", "/train_finished:3"]


async def test_async_brackets_the_body(aclient, fake):
    async with aclient.training_step(3) as begun:
        assert fake.order() == ["/train_begin:3"] and begun.step == 3
    assert fake.order() == ["/train_begin:3", "/train_finished:3"]


def test_sync_body_error_still_finishes_and_propagates(client, fake):
    error = UpdateFailed("nan loss")
    with pytest.raises(UpdateFailed) as info:
        with client.training_step(1):
            raise error
    assert info.value is error
    assert fake.order() == ["/train_begin:1", "/train_finished:1"] and fake.open_step is None


async def test_async_body_error_still_finishes_and_propagates(aclient, fake):
    with pytest.raises(UpdateFailed, match="nan loss"):
        async with aclient.training_step(1):
            raise UpdateFailed("nan loss")
    assert fake.order() == ["/train_begin:1", "/train_finished:1"]


async def test_async_cancelled_body_still_finishes(aclient, fake):
    async def update():
        async with aclient.training_step(2):
            await asyncio.sleep(30)

    task = asyncio.create_task(update())
    while fake.open_step != 2:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.order() == ["/train_begin:2", "/train_finished:2"]


def test_sync_failed_begin_skips_the_body(client, fake):
    fake.open_step = 0  # a previous step was never finished: the router answers 409
    ran = []
    with pytest.raises(PearlConflict, match="is open"):
        with client.training_step(1):
            ran.append(True)
    assert ran == [] and fake.order() == ["/train_begin:1"]  # refused; no train_finished


async def test_async_failed_begin_skips_the_body(aclient, fake):
    fake.fail("/train_begin", 503, "no capacity", times=10)
    ran = []
    with pytest.raises(PearlUnavailable, match="no capacity"):
        async with aclient.training_step(1):
            ran.append(True)
    assert ran == [] and not any(a.path == "/train_finished" for a in fake.attempts)


def test_sync_body_error_wins_over_a_failed_finish(client, fake):
    fake.fail("/train_finished", 400, "finish refused", times=1)
    with pytest.raises(UpdateFailed) as info:
        with client.training_step(1):
            raise UpdateFailed("oom")
    assert any("finish refused" in note for note in info.value.__notes__)


async def test_async_body_error_wins_over_a_failed_finish(aclient, fake):
    fake.fail("/train_finished", 400, "finish refused", times=1)
    with pytest.raises(UpdateFailed) as info:
        async with aclient.training_step(1):
            raise UpdateFailed("oom")
    assert any("finish refused" in note for note in info.value.__notes__)


def test_sync_finish_error_surfaces_after_a_good_body(client, fake):
    fake.fail("/train_finished", 409, "no open step", "conflict")
    with pytest.raises(PearlConflict, match="no open step"):
        with client.training_step(1):
            pass


async def test_async_begin_waits_for_the_router(aclient, fake):
    fake.delay("/train_begin", 0.3)
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with aclient.training_step(1):
        assert loop.time() - start >= 0.3


def _finished_bodies(fake) -> list[dict]:
    return [s.body for s in fake.calls if s.path == "/train_finished"]


def test_remaining_is_asked_when_the_update_ends(client, fake):
    running = [9]
    with client.training_step(2, remaining=lambda: running[0]):
        running[0] = 4  # trajectories finished while the update ran
    assert _finished_bodies(fake)[0]["remaining_trajectories"] == 4


async def test_async_remaining_is_sent_also_when_the_body_fails(aclient, fake):
    with pytest.raises(UpdateFailed):
        async with aclient.training_step(2, remaining=lambda: 3):
            raise UpdateFailed("oom")
    assert _finished_bodies(fake)[0]["remaining_trajectories"] == 3


@pytest.mark.parametrize("answer", [lambda: -1, lambda: True, lambda: 2.5, lambda: 1 // 0])
def test_an_unusable_count_still_finishes_the_step_without_one(client, fake, answer):
    with client.training_step(5, remaining=answer):
        pass
    assert fake.open_step is None and "remaining_trajectories" not in _finished_bodies(fake)[0]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_train_finished_rejects_a_bad_count_before_sending(client, fake, bad):
    with pytest.raises(ValueError, match="remaining_trajectories"):
        client.train_finished(0, remaining_trajectories=bad)
    assert fake.calls == []
