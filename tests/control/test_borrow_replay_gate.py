"""The borrowing gate replays the last unborrowed step with the overlap workers serving
from when lent workers have started serving so far (core.borrow_replay), over real HTTP
on emulated workers: a borrow equation (7) would make is refused when the last step's
trajectories would not have ended sooner, and the record shows the replay. (Which
steps a replay saves on, and by how much, is tests/core/test_borrow_replay.py.)"""
from __future__ import annotations

import asyncio

from pearl_rl_adapter import tag_headers
from tests.control.conftest import AUTH, cluster_config, running_cluster


async def _rollout(c, *, trajectories: int, turns: int, env_s: float, tokens: int) -> None:
    async def trajectory(i: int) -> None:
        ids = [7 + i] * 40
        for k in range(turns):
            if k:
                await asyncio.sleep(env_s)
            r = await c.client.post(c.url + "/generate", timeout=60, headers=tag_headers(f"t{i}", k), json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}})
            assert r.status_code == 200, r.text
            ids = ids + [3] * (tokens + 8)
    await asyncio.gather(*(trajectory(i) for i in range(trajectories)))


async def _gate_record(c) -> dict:
    control = (await c.client.get(c.url + "/pearl/state", headers=AUTH)).json()["control"]
    return [d for d in control["decisions"] if d["operation"] == "borrow_gate"][-1]


async def test_a_step_that_waited_on_its_environment_is_not_worth_a_borrow(tiny_model_dir):
    # Equation (7) on the tiny profile refitted by the step saves 0.006-0.01 s (2 -> 4
    # workers), over this toggle cost; the pool-usage check is off, so only the replay can refuse.
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 0.001,
                                                  "min_dedicated_busy_share": 0.0})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        fin = await c.admin("/train_finished", {"step": 0, "remaining_trajectories": 0})
        assert not fin["borrowing"]  # nothing left: this step runs unborrowed
        assert (await _gate_record(c))["replay"] is None  # no step closed yet
        await _rollout(c, trajectories=4, turns=3, env_s=0.4, tokens=2)
        await c.admin("/train_begin", {"step": 1})  # closes the unborrowed step

        fin = await c.admin("/train_finished", {"step": 1})
        record = await _gate_record(c)
        replay = record["replay"]
        scale = c.control.learning.time_scale
        launch = c.control.phases.mean_s("preparation")  # the dedicated workers' own launch
        assert launch is not None and replay["join_after_s"] >= launch * scale
        # Four trajectories of three 2-token turns, 0.4 s in their environment between
        # turns: the slowest one's requests are a few milliseconds of its 0.8 s.
        timeline = c.control.learning.timeline
        assert timeline.workers == 2 and sorted(len(t) for t in timeline.trajectories) == [3] * 4
        assert 0 < replay["speedup"] <= 1 and 0 <= replay["saved_s"] < record["toggle_cost_s"] / 10, replay
        assert record["benefit_s"] > record["toggle_cost_s"]  # equation (7) said borrow
        assert not fin["borrowing"] and "replayed" in fin["reason"], fin["reason"]
        assert record["overruled"] and record["overruled"] in fin["reason"]


async def test_the_replay_check_can_be_turned_off(tiny_model_dir):
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 0.001,
                                                  "min_dedicated_busy_share": 0.0, "replay_check": False})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0, "remaining_trajectories": 0})
        await _rollout(c, trajectories=4, turns=3, env_s=0.4, tokens=2)
        await c.admin("/train_begin", {"step": 1})
        fin = await c.admin("/train_finished", {"step": 1})
        assert fin["borrowing"], fin["reason"]
        assert (await _gate_record(c))["replay"] is None


def _seconds(phases, zone: str, phase: str) -> list[float]:
    return [r.seconds for r in phases.records if r.ok and r.zone == zone and r.phase == phase]


async def test_lent_workers_arrive_as_their_own_launches_took(tiny_model_dir):
    """Before the first borrow a lent worker is taken to launch as the dedicated ones did;
    after it, as the lent workers' own launches took, not a mean over every launch."""
    config = cluster_config(tiny_model_dir, gate={"enabled": False})  # ungated: borrows at once
    async with running_cluster(config) as c:
        phases = c.control.phases
        assert phases.mean_s("preparation", zone="overlap") is None
        assert c.control.lent_s("preparation") == phases.mean_s("preparation")  # the bootstrap's
        assert _seconds(phases, "dedicated", "preparation")
        await c.admin("/train_begin", {"step": 0})
        assert (await c.admin("/train_finished", {"step": 0}))["borrowing"]
        await c.settle()
        lent = _seconds(phases, "overlap", "preparation")
        assert lent and c.control.lent_s("preparation") == sum(lent) / len(lent)
        # Returned and kept, then lent again: they resume, and resumes are timed the same way.
        await c.admin("/train_begin", {"step": 1})
        assert (await c.admin("/train_finished", {"step": 1}))["borrowing"]
        await c.settle()
        resumes = _seconds(phases, "overlap", "activation")
        assert resumes and c.control.lent_s("activation") == sum(resumes) / len(resumes)
