"""The asynchronous RL driver end to end: the PEARL router over in-process emulated
workers (``--time-scale 50``), hooks in order (also when training fails, on stop and on
cancellation), token counts that match the workload, staleness 1, and router errors that
are retried, counted and never hang a step."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.dispatch import DispatchConfig
from pearl_sglang.workload import (
    AgenticRLDriver, DriverConfig, StepResult, SweSampler, TrainerProfile, TrainingFailed,
)
from tests.router.conftest import ADMIN_TOKEN, running_router
from tests.support.emulated import emulators
from tests.workload.support import (
    HANG, SCALE, TINY, HookLog, Scripted, expected_order, scaled_time, scripted_server,
)

FLAGS = ("--time-scale", str(int(SCALE)))
PROFILE = TrainerProfile(seconds_per_step=2.0, seconds_per_token=0.001)


def _expected(sampler: SweSampler, index: int) -> tuple[list[tuple[int, int]], int]:
    """(prompt tokens, response tokens) per turn and the trained length, by replay."""
    length, turns = len(sampler.initial_prompt(index)), []
    wanted = sampler.turn_count(index)
    for k in range(wanted):
        plan = sampler.turn(index, k)
        turns.append((length, plan.response_tokens))
        if k + 1 == wanted or not sampler.fits(length + plan.response_tokens + len(plan.observation_ids),
                                               sampler.turn(index, k + 1)):
            return turns, length + plan.response_tokens
        length += plan.response_tokens + len(plan.observation_ids)
    raise AssertionError("unreachable")


async def _run_on_cluster(driver_kw: dict, *, workers: int = 3) -> list[StepResult]:
    async with emulators(workers, *FLAGS) as ws:
        async with running_router(regular=[u for u, _ in ws]) as (url, _app, _store):
            return await AgenticRLDriver(url, **driver_kw).run()


async def test_two_steps_over_router_and_emulators():
    time = scaled_time()
    log, seen = HookLog(time), []
    results = await _run_on_cluster(dict(workload=TINY, trainer_profile=PROFILE, time=time,
                                         config=DriverConfig(steps=2), hooks=log.hooks(),
                                         on_step=seen.append))
    assert log.order() == expected_order(2)
    assert seen == results and [r.step for r in results] == [0, 1]
    assert [r.weight_version for r in results] == ["v0", "v1"]
    sampler = SweSampler(TINY)
    for r in results:
        assert r.trajectories == TINY.batch_size and r.failed_trajectories == 0 and r.errors == 0
        assert all(t.attempts == 1 for t in r.telemetry)
        by_traj: dict[str, list] = {}
        for t in r.telemetry:
            by_traj.setdefault(t.trajectory_id, []).append(t)
        assert len(by_traj) == TINY.batch_size
        trained = 0
        for i in range(TINY.batch_size):
            index = r.step * TINY.batch_size + i
            turns, tokens = _expected(sampler, index)
            got = sorted(by_traj[f"traj-{index}"], key=lambda t: t.turn_index)
            assert [(t.prompt_tokens, t.generated_tokens) for t in got] == turns
            assert all(t.cached_tokens <= t.prompt_tokens for t in got)
            trained += tokens
        assert r.turns == len(r.telemetry)
        assert r.rollout_generated_tokens == sum(t.generated_tokens for t in r.telemetry)
        assert r.training_tokens == trained
        assert r.throughput == pytest.approx(
            (r.rollout_generated_tokens + r.training_tokens) / (r.end - r.start))
        assert 0 < r.mean_trajectory_s <= r.max_trajectory_s <= r.rollout_end - r.rollout_start + 1e-6
        assert r.train_end - r.train_start >= PROFILE.duration_s(r.training_tokens) * 0.95
    first, second = results
    # Staleness 1: step 1's rollout overlaps step 0's training, never precedes batch 0.
    assert first.rollout_end <= second.rollout_start < first.train_end
    assert second.train_start >= first.end and second.start == first.end
    begin1 = next(t for name, step, t in log.calls if (name, step) == ("train_begin", 1))
    assert begin1 >= second.rollout_end


async def test_the_next_rollout_starts_once_the_router_has_answered_train_begin():
    """Step k is closed at the router (and what training takes back is back) before any turn
    of step k+1 reaches it; that rollout still runs beside training k."""
    time = scaled_time()
    log = HookLog(time, begin_s=2.0)
    first, second = await _run_on_cluster(dict(workload=TINY, trainer_profile=PROFILE, time=time,
                                                config=DriverConfig(steps=2), hooks=log.hooks()))
    begin0 = next(t for name, step, t in log.calls if (name, step) == ("train_begin", 0))
    assert second.rollout_start >= begin0 + 2.0
    assert first.train_start <= begin0 and second.rollout_start < first.train_end


async def test_failed_training_still_sends_train_finished_and_stops():
    time = scaled_time()
    log, seen = HookLog(time), []

    class FailsAtStepOne:
        async def train(self, step, batch):
            await time.wait(1.0)
            if step == 1:
                raise RuntimeError("optimizer blew up")

    with pytest.raises(TrainingFailed) as e:
        await _run_on_cluster(dict(workload=TINY, time=time, trainer=FailsAtStepOne(),
                                   config=DriverConfig(steps=3), hooks=log.hooks(),
                                   on_step=seen.append), workers=2)
    assert e.value.step == 1 and isinstance(e.value.__cause__, RuntimeError)
    assert log.order() == expected_order(1) + [("train_begin", 1), ("train_finished", 1)]
    assert [r.step for r in seen] == [0]
    assert not [t for t in asyncio.all_tasks() if "_rollout" in repr(t.get_coro())]


@pytest.mark.parametrize("fraction,low,high", [(0.0, 0.6, 1.0), (0.6, 0.0, 0.45)])
async def test_rewrite_fraction_shows_in_cached_tokens(fraction, low, high):
    results = await _run_on_cluster(dict(workload=replace(TINY, rewrite_fraction=fraction),
                                         trainer_profile=PROFILE, time=scaled_time(),
                                         config=DriverConfig(steps=1)), workers=2)
    later = [t for t in results[0].telemetry if t.turn_index > 0]
    ratio = sum(t.cached_tokens for t in later) / sum(t.prompt_tokens for t in later)
    assert low <= ratio <= high


async def test_stop_ends_after_the_current_step():
    time = scaled_time()
    log = HookLog(time)
    script = Scripted([])
    async with scripted_server(script) as url:
        driver = AgenticRLDriver(url, workload=TINY, trainer_profile=PROFILE, time=time,
                                 hooks=log.hooks(), on_step=lambda r: driver.stop())
        results = await driver.run()
    assert [r.step for r in results] == [0]
    assert log.order() == expected_order(1)
    assert not [t for t in asyncio.all_tasks() if "_rollout" in repr(t.get_coro())]


async def test_cancellation_during_training_still_sends_train_finished():
    time = scaled_time()
    log = HookLog(time)
    async with scripted_server(Scripted([])) as url:
        driver = AgenticRLDriver(url, workload=TINY, time=time, hooks=log.hooks(),
                                 trainer_profile=TrainerProfile(seconds_per_step=10_000.0))
        task = asyncio.create_task(driver.run())
        while not log.calls:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert log.order() == [("train_begin", 0), ("train_finished", 0)]
    assert not [t for t in asyncio.all_tasks() if "_rollout" in repr(t.get_coro())]


async def test_router_errors_are_retried_counted_and_never_hang():
    # The real router with no worker answers 503 once its admission wait runs out.
    config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600,
                          admission_wait_s=0.1, dispatch=DispatchConfig(route_wait_s=0.1))
    small = replace(TINY, batch_size=4, group_size=2)
    async with running_router(config=config) as (url, _app, _store):
        results = await AgenticRLDriver(
            url, workload=small, trainer_profile=PROFILE, time=scaled_time(),
            config=DriverConfig(steps=1, retry_delays_s=(0.5, 0.5))).run()
    r = results[0]
    assert r.trajectories == 4 and r.failed_trajectories == 4 and r.turns == 0
    assert r.errors == 4 * 3 and "503" in r.error_samples[0]
    assert r.rollout_generated_tokens == 0
    assert r.training_tokens == sum(len(SweSampler(small).initial_prompt(i)) for i in range(4))


async def test_a_transient_error_mid_trajectory_keeps_its_context():
    script = Scripted([200, 200, 502, HANG])
    async with scripted_server(script) as url:
        results = await AgenticRLDriver(
            url, workload=replace(TINY, batch_size=1, group_size=1, turns_min=4), time=scaled_time(),
            trainer_profile=PROFILE,
            config=DriverConfig(steps=1, retry_delays_s=(0.1, 0.1), request_timeout_s=0.3)).run()
    r = results[0]
    assert r.errors == 2 and r.failed_trajectories == 0 and r.turns == 4 == len(script.bodies) - 2
    failed, timed_out, retried = script.bodies[2], script.bodies[3], script.bodies[4]
    assert failed == timed_out == retried
    assert script.headers[2]["X-Pearl-Turn"] == script.headers[4]["X-Pearl-Turn"] == "2"


@pytest.mark.parametrize("budget", [1024, 400, 250, 160])
def test_planned_turns_are_the_turns_a_trajectory_runs(budget):
    """Within and cut by the trajectory token budget (the driver's hint says this)."""
    sampler = SweSampler(replace(TINY, max_trajectory_tokens=budget, turns_max=12, turns_median=8))
    for index in range(60):
        assert sampler.planned_turns(index) == len(_expected(sampler, index)[0])
        assert sampler.turns_hint(index, 0.0) == sampler.planned_turns(index)
        noisy = [sampler.turns_hint(index, 0.5) for _ in range(2)]
        assert noisy[0] == noisy[1] >= 1  # deterministic per index
    assert len({sampler.turns_hint(i, 0.5) - sampler.planned_turns(i) for i in range(60)}) > 1
    cut = sum(sampler.planned_turns(i) < sampler.turn_count(i) for i in range(60))
    assert (cut == 0) if budget == 1024 else (cut > 0)
    with pytest.raises(InvalidConfig, match="sigma"):
        sampler.turns_hint(0, -0.1)


async def test_the_driver_tells_the_router_each_trajectorys_turns_when_asked():
    small = replace(TINY, batch_size=3, group_size=1)
    for sigma, expected in ((None, None), (0.0, lambda i: str(SweSampler(small).planned_turns(i)))):
        script = Scripted([])
        async with scripted_server(script) as url:
            await AgenticRLDriver(url, workload=small, time=scaled_time(), trainer_profile=PROFILE,
                                  config=DriverConfig(steps=1, turns_hint_sigma=sigma)).run()
        for h in script.headers:
            index = int(h["X-Pearl-Trajectory-Id"].rsplit("-", 1)[1])
            assert h.get("X-Pearl-Expected-Turns") == (None if expected is None else expected(index))
        assert len(script.headers) == sum(SweSampler(small).planned_turns(i) for i in range(3))
    with pytest.raises(InvalidConfig, match="turns_hint_sigma"):
        DriverConfig(turns_hint_sigma=-1.0).validate()
