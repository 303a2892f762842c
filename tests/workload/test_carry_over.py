"""Partial-rollout carry-over over the router and emulated workers: each step ends once a
share of its batch finished, the rest go on in the next step from their last completed
turn, every trajectory is trained exactly once, and each turn records its policy."""
from __future__ import annotations

import math

import pytest

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.workload import AgenticRLDriver, DriverConfig, SweSampler, TrainerProfile
from tests.router.conftest import running_router
from tests.support.emulated import emulators
from tests.workload.support import SCALE, TINY, HookLog, scaled_time
from tests.workload.test_driver import _expected

SHARE = 0.5
STEPS = 4


def _allowed_versions(step: int) -> set[str]:
    """Rollout k runs beside the training of step k-1 (staleness 1): on the weights
    pushed after step k-2, or after step k-1 once that push lands."""
    older = "initial" if step < 2 else f"v{step - 2}"
    return {older} | ({f"v{step - 1}"} if step >= 1 else set())


async def test_unfinished_trajectories_are_carried_and_trained_exactly_once():
    time = scaled_time()
    log = HookLog(time)
    config = DriverConfig(steps=STEPS, carry_over_share=SHARE)
    async with emulators(2, "--time-scale", str(int(SCALE))) as ws:
        async with running_router(regular=[u for u, _ in ws]) as (url, _app, _store):
            results = await AgenticRLDriver(url, workload=TINY, time=time, hooks=log.hooks(), config=config,
                                            trainer_profile=TrainerProfile(seconds_per_step=1.0)).run()
    assert [r.step for r in results] == list(range(STEPS))
    trained = [tid for r in results for tid in r.trajectory_ids]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    launched = set(trained) | set(results[-1].carried_out)
    assert not set(trained) & set(results[-1].carried_out)
    # New trajectories are numbered in launch order: none skipped, none lost.
    assert launched == {f"traj-{i}" for i in range(len(launched))}
    carried_any = False
    sampler = SweSampler(TINY)
    for prev, r in zip([None, *results], results):
        assert r.carried_in == (prev.carried_out if prev else ())
        if prev is not None:
            # What the carried ones had generated before the cut; those carried on again hold the rest.
            before_cut = sum(t.generated_tokens for t in r.telemetry if t.trajectory_id in r.carried_in
                             and t.step < r.step)
            if set(r.carried_in) <= set(r.trajectory_ids):
                assert prev.carried_out_generated_tokens == before_cut
            else:
                assert prev.carried_out_generated_tokens >= before_cut
        assert len(r.trajectory_ids) >= math.ceil(SHARE * TINY.batch_size)
        assert len(r.trajectory_ids) + len(r.carried_out) == TINY.batch_size
        assert not set(r.trajectory_ids) & set(r.carried_out)
        by_traj: dict[str, list] = {}
        for t in r.telemetry:
            by_traj.setdefault(t.trajectory_id, []).append(t)
        assert set(by_traj) == set(r.trajectory_ids) and r.trajectories == len(r.trajectory_ids)
        for tid, turns in by_traj.items():
            turns.sort(key=lambda t: t.turn_index)
            # Resumed from the last completed turn: every turn once, the same prompts and
            # responses as an uninterrupted run of this trajectory.
            expected, _ = _expected(sampler, int(tid.split("-")[1]))
            assert [(t.prompt_tokens, t.generated_tokens) for t in turns] == expected
            assert [t.turn_index for t in turns] == list(range(len(expected)))
            for t in turns:
                assert t.step <= r.step and t.policy_version in _allowed_versions(t.step)
                assert isinstance(t.weight_version, str)
            versions = [t.policy_version for t in turns]
            order = ["initial"] + [f"v{k}" for k in range(STEPS)]
            assert versions == sorted(versions, key=order.index)
            # A carried trajectory that had completed turns before its cut spans two steps.
            carried_any |= tid in r.carried_in and len({t.step for t in turns}) > 1
    assert carried_any, "no trajectory was carried with turns done: the test did not exercise it"


def test_carry_over_share_is_validated():
    with pytest.raises(InvalidConfig, match="carry_over_share"):
        DriverConfig(carry_over_share=0.0).validate()
    with pytest.raises(InvalidConfig, match="carry_over_share"):
        DriverConfig(carry_over_share=1.5).validate()
    DriverConfig(carry_over_share=1.0).validate()
