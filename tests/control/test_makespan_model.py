"""The control plane decides with the configured makespan model: the tail-aware model
refuses a borrow whose saving the slowest trajectory's latency swallows, which the
paper's model takes; both models' predictions are recorded for every step."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pearl_sglang.control.cluster_config import ConfigError
from pearl_sglang.core.tail import TurnSpread
from tests.control.conftest import AUTH, cluster_config, running_cluster

# One tool call in a few runs for minutes: the step is bound by it, not by the pool.
HEAVY_TAIL = TurnSpread(env_mean_s=0.2, env_std_s=50.0, tokens_mean=50.0)


@pytest.mark.parametrize("model, borrows", [("paper", True), ("tail", False)])
async def test_gate_decides_with_the_configured_model(tiny_model_dir, model, borrows):
    # Paper's saving on the tiny profile (2 -> 4 workers) is ~0.13 s; the tail-aware one
    # under a 50 s environment spread is ~0.03 s.  A 0.05 s toggle cost sits between.
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 0.05}, makespan_model=model)
    async with running_cluster(config) as c:
        c.control.state = replace(c.control.state, learning=replace(c.control.learning, spread=HEAVY_TAIL))
        await c.admin("/train_begin", {"step": 0})
        fin = await c.admin("/train_finished", {"step": 0})
        assert fin["borrowing"] is borrows, fin["reason"]
        await c.settle()
        await c.admin("/train_begin", {"step": 1})
        control = (await c.client.get(c.url + "/pearl/state", headers=AUTH)).json()["control"]
        decision = next(d for d in control["decisions"] if d["operation"] == "train_begin")
        assert decision["makespan_model"] == model
        (step,) = control["step_predictions"]
        assert step["makespan_model"] == model and set(step["predicted_by_model_s"]) == {"paper", "tail"}
        assert step["predicted_s"] == step["predicted_by_model_s"][model]
        # The floor (one 50 s-spread tool call) dominates the tail-aware prediction.
        assert step["predicted_by_model_s"]["tail"] > 100 > step["predicted_by_model_s"]["paper"]


def test_makespan_model_is_validated(tiny_model_dir):
    with pytest.raises(ConfigError, match="makespan_model must be 'paper' or 'tail'"):
        cluster_config(tiny_model_dir, makespan_model="median")
    assert cluster_config(tiny_model_dir).makespan_model == "paper"


async def test_a_step_records_the_prediction_made_for_it(tiny_model_dir):
    """The step closed at train_begin carries the prediction of the configuration that
    ran (here the borrowed pool decided at train_finished), not the one train_begin then
    makes for the next rollout."""
    config = cluster_config(tiny_model_dir, gate={"enabled": False}, makespan_model="paper")
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        assert (await c.admin("/train_finished", {"step": 0}))["borrowing"]
        await c.settle()
        await c.admin("/train_begin", {"step": 1})
        control = (await c.client.get(c.url + "/pearl/state", headers=AUTH)).json()["control"]
        borrowed = next(d for d in control["decisions"] if d["operation"] == "train_finished")
        following = [d for d in control["decisions"] if d["operation"] == "train_begin"][-1]
        assert borrowed["budget"] == 4 and following["budget"] == 2
        (step,) = control["step_predictions"]
        assert step["borrowed"] is True
        assert step["predicted_s"] == borrowed["predicted_makespan_s"] != following["predicted_makespan_s"]


async def test_decisions_scale_candidates_by_what_each_mode_delivered(tiny_model_dir):
    """A finished colocated step teaches the correction its observed/predicted ratio;
    the next decision's candidates are the model's predictions times that factor (the
    unseen PD mode gets the overall one times the PD prior), and state and metrics show it."""
    from pearl_sglang.core.decision import enumerate_candidates

    config = cluster_config(tiny_model_dir, pd_mode="auto", thresholds={"mode": 0.99, "ratio": 0.99})
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})
        await c.settle()
        await c.admin("/train_begin", {"step": 1})
        control = (await c.client.get(c.url + "/pearl/state", headers=AUTH)).json()["control"]
        (step,) = control["step_predictions"]
        assert step["mode"] == "colocated" and step["corrected_s"] == step["predicted_s"]  # nothing learned yet
        ratio = step["observed_s"] / step["predicted_s"]
        learned = control["mode_correction"]["by_mode"]
        assert learned == {"colocated": {"factor": pytest.approx(min(max(ratio, 0.5), 2.0)), "steps": 1}}
        decision = [d for d in control["decisions"] if d["operation"] == "train_begin"][-1]
        factor = learned["colocated"]["factor"]
        prior = config.mode_feedback.pd_prior
        assert decision["mode_factors"] == {"colocated": pytest.approx(factor),
                                            "disaggregated": pytest.approx(factor * prior)}
        raw = enumerate_candidates(c.control.profile(), decision["budget"])
        assert [d["predicted_makespan_s"] for d in decision["candidates"]] == \
            pytest.approx([r.predicted_makespan_s * factor * (1 if r.topology.colocated else prior) for r in raw])
        text = (await c.client.get(c.url + "/metrics", headers=AUTH)).text
        assert f'pearl_mode_observed_over_predicted{{mode="colocated"}} {factor!r}' in text


@pytest.mark.parametrize("fit", ["all", "workload"])
async def test_profile_fit_workload_keeps_the_configured_engine_rates(tiny_model_dir, fit):
    """After a step with streamed multi-turn traffic the tracker has fitted the engine's
    rates and the workload's symbols; the control plane's profile (decisions and
    placement) takes all of them, or under ``workload`` the workload's alone."""
    config = cluster_config(tiny_model_dir, profile_fit=fit)
    async with running_cluster(config) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})
        await c.settle()

        async def trajectory(i: int) -> None:
            ids = [7 + i] * 40
            for _ in range(3):
                r = await c.client.post(c.url + "/generate", timeout=60, json={
                    "input_ids": ids, "stream": True, "rid": None,
                    "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
                assert r.status_code == 200, r.text
                ids = ids + [3] * 48
        await asyncio.gather(*(trajectory(i) for i in range(6)))
        await c.admin("/train_begin", {"step": 1})
        est = c.control.learning.tracker.estimate
        assert est.t_prefill is not None and est.r is not None and est.t_prefill != config.profile.t_prefill
        profile = c.control.profile()
        assert profile.r == est.r
        if fit == "all":
            assert profile.t_prefill == est.t_prefill
        else:
            assert (profile.A, profile.b, profile.t_prefill) == \
                (config.profile.A, config.profile.b, config.profile.t_prefill)


def test_profile_fit_is_validated(tiny_model_dir):
    with pytest.raises(ConfigError, match="profile_fit must be 'all' or 'workload'"):
        cluster_config(tiny_model_dir, profile_fit="engine")


def test_mode_feedback_is_validated(tiny_model_dir):
    with pytest.raises(ConfigError, match="mode_feedback: mode_feedback alpha must be in"):
        cluster_config(tiny_model_dir, mode_feedback={"alpha": 0})
    with pytest.raises(ConfigError, match="unknown key"):
        cluster_config(tiny_model_dir, mode_feedback={"beta": 1})
    assert cluster_config(tiny_model_dir, mode_feedback={"enabled": False}).mode_feedback.enabled is False
