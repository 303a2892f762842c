"""A tiny replay: the real router and control plane over in-process emulated workers on
virtual time finish training steps in a few real seconds."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from benchmarks.harness.replay import ReplayConfig, cluster_mapping, replay, resolve_system
from benchmarks.harness.systems import SEGMENTS, core_profile, system
from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.core.profile import Profile


@pytest.mark.parametrize("name", ["pearl", "rlboost"])
def test_tiny_replay_finishes_steps_quickly(name):
    # Short trajectories keep the run to a few CPU seconds; the window still spans trace changes.
    config = ReplayConfig(system=name, segment=1, minutes=5, batch_size=8, group_size=4, train_step_s=60,
                          workload={"turns_median": 6, "turns_max": 10})
    real = time.perf_counter()
    result = replay(config)
    real = time.perf_counter() - real
    summary = result["summary"]
    assert summary["steps"] > 0
    assert summary["errors"] == 0 and summary["failed_trajectories"] == 0
    step = result["steps"][0]
    assert step["throughput"] > 0 and step["generated_tokens"] > 0 and step["training_tokens"] > 0
    # The run covered the whole window in virtual time, in a few real seconds.
    assert result["run"]["virtual_s"] >= 5 * 60
    assert result["run"]["loop"]["jumps"] > 0
    # ~6 CPU s; ~7 s real on an idle 2-core machine. Real time is only a hang guard, since
    # the machine is shared (under a load of 8 the same run took ~35 s real).
    assert result["run"]["cpu_s"] < 20, result["run"]
    assert real < 120, f"replay took {real:.1f} s real"
    # Every launched worker's tokens count, those of workers that left during the run too.
    engines = result["engines"]
    assert len(engines) == result["launches"] and any(e.get("stopped") for e in engines)
    assert sum(e["generated_tokens"] for e in engines) >= sum(s["generated_tokens"] for s in result["steps"])
    if name == "rlboost":
        assert result["trace"]["targets"], "rlboost follows the preemptible trace"
        assert not any(s["borrowing"] for s in result["steps"])
        assert all(set(s["roles"]) <= {"C"} for s in result["steps"])


@pytest.mark.parametrize("pd_mode", ["auto", "disaggregated"])
def test_worker_transports_replay_the_same_steps(pd_mode):
    """The harness's in-process generation calls change its CPU cost, not its results:
    virtual time, every step's tokens and topology match a replay over loopback HTTP."""
    config = ReplayConfig(system="pearl", segment=1, minutes=4, batch_size=8, group_size=4, train_step_s=60,
                          workload={"turns_median": 4, "turns_max": 6}, pd_mode=pd_mode)
    runs = {t: replay(replace(config, worker_transport=t)) for t in ("in-process", "http")}
    fields = ("step", "end_s", "generated_tokens", "training_tokens", "turns", "topology", "borrowing", "errors")
    steps = {t: [{k: s[k] for k in fields} for s in r["steps"]] for t, r in runs.items()}
    assert steps["in-process"] and steps["in-process"] == steps["http"]
    if pd_mode == "disaggregated":  # the prefill's one-document call went in-process too
        assert all(set(s["topology"]) & {"P"} for s in runs["in-process"]["steps"]), steps
    assert runs["in-process"]["run"]["virtual_s"] == runs["http"]["run"]["virtual_s"]
    # The router's per-worker busy time comes from when chunks reach it, which the transport
    # can shift by a fraction of an iteration: equal within 0.1%, the rest exactly.
    busy = ("busy_busiest_over_mean_max", "busy_busiest_over_mean_mean")
    summaries = {t: r["summary"] for t, r in runs.items()}
    assert {k: v for k, v in summaries["in-process"].items() if k not in busy} == \
        {k: v for k, v in summaries["http"].items() if k not in busy}
    for k in busy:
        assert summaries["in-process"][k] == pytest.approx(summaries["http"][k], rel=1e-3)


def test_front_doors_replay_the_same_steps():
    """The driver's turns into the router in-process change the replay's CPU cost, not its
    results: every step record, the summary, the samples and virtual time equal those of a
    replay whose driver speaks HTTP to the router. The one exception is the first sample's
    critical path: taken at virtual time 0, when the first turns are sent, it sees them or
    not by the order of events at that instant (in-process turns arrive sooner)."""
    config = ReplayConfig(system="pearl", segment=1, minutes=4, batch_size=8, group_size=4, train_step_s=60,
                          workload={"turns_median": 4, "turns_max": 6})
    runs = {d: replay(replace(config, front_door=d)) for d in ("in-process", "http")}
    assert runs["in-process"]["steps"] and runs["in-process"]["steps"] == runs["http"]["steps"]
    for k in ("summary", "engines"):
        assert runs["in-process"][k] == runs["http"][k], k
    first, *rest = runs["in-process"]["samples"]
    first_http, *rest_http = runs["http"]["samples"]
    assert rest == rest_http and any(s["stragglers"] for s in rest)
    assert first["t_s"] == first_http["t_s"] == 0.0
    assert {k: first[k] for k in first if k not in ("running", "stragglers")} == \
        {k: first_http[k] for k in first_http if k not in ("running", "stragglers")}
    assert runs["in-process"]["run"]["virtual_s"] == runs["http"]["run"]["virtual_s"]


@pytest.mark.parametrize("pd_mode", ["colocated", "disaggregated"])
def test_engine_steppings_replay_the_same_steps(pd_mode):
    """Decode stretches change how many engine events a replay runs, not its results: every
    step record, the summary, virtual time and each worker's busy time equal those of
    iteration-by-iteration stepping."""
    config = ReplayConfig(system="pearl", segment=1, minutes=4, batch_size=8, group_size=4, train_step_s=60,
                          workload={"turns_median": 4, "turns_max": 6}, pd_mode=pd_mode)
    runs = {s: replay(replace(config, engine_stepping=s)) for s in ("stretch", "iteration")}
    stretch, iteration = runs["stretch"], runs["iteration"]
    assert stretch["steps"] and stretch["steps"] == iteration["steps"]
    assert stretch["summary"] == iteration["summary"] and stretch["samples"] == iteration["samples"]
    assert stretch["run"]["virtual_s"] == iteration["run"]["virtual_s"]
    # each worker's tokens and busy seconds by phase, to the last bit
    assert stretch["engines"] and stretch["engines"] == iteration["engines"]
    if pd_mode == "disaggregated":
        assert all(set(s["topology"]) & {"P"} for s in stretch["steps"])
    assert stretch["run"]["loop"]["steps"] < iteration["run"]["loop"]["steps"] / 5, runs


def test_engine_stepping_leaves_cached_runs_valid():
    from benchmarks.experiments.runner import _key
    config = ReplayConfig(system="pearl", segment=2)
    assert _key(config) != _key(replace(config, engine_stepping="iteration"))
    assert _key(config) == _key(replace(config, engine_stepping="stretch"))


def test_systems_map_to_cluster_configs(tmp_path):
    for name, expect in [("roll", (4, 0, "colocated", False)), ("rlboost", (4, 0, "colocated", False)),
                         ("pearl", (4, 16, "auto", True)), ("pearl-forced-pd", (4, 16, "disaggregated", True)),
                         ("roll-large-14", (14, 0, "colocated", False))]:
        sysdef = system(name)
        cluster = ClusterConfig.from_mapping(cluster_mapping(ReplayConfig(system=name), sysdef, tmp_path))
        assert (len(cluster.zones.dedicated), len(cluster.zones.overlap), cluster.pd_mode,
                cluster.gate.borrow) == expect, name
        assert cluster.engine.emulator["time_scale"] == 1 and cluster.time_scale == 1.0
    assert resolve_system(ReplayConfig(system="roll-large", segment=2)).rollout_gpus == 10
    assert system("pearl-ungated").gate == {"enabled": False, "borrow": True}
    assert set(SEGMENTS) == {1, 2, 3}
    assert core_profile("qwen3-30b-a3b", 64).K == 98_304


def test_replay_records_predicted_and_observed_makespan():
    config = ReplayConfig(system="pearl", segment=1, minutes=5, batch_size=8, group_size=4, train_step_s=60,
                          workload={"turns_median": 6, "turns_max": 10})
    result = replay(config)
    recorded = [s["prediction"] for s in result["steps"] if s["prediction"]]
    assert recorded, "no step carried a prediction"
    for p in recorded:
        assert p["predicted_s"] > 0 and p["observed_s"] > 0 and p["rollout_s"] > 0
        assert set(p["predicted_by_model_s"]) == {"paper", "tail"}
        # The configured model (the default) is the one the control plane acts on.
        assert p["predicted_s"] == p["predicted_by_model_s"][ClusterConfig().makespan_model]
        assert Profile.from_dict(p["profile"]).theta >= 0  # what the models predicted with
    summary = result["summary"]
    assert summary["predicted_steps"] == len(recorded)
    # Errors are against the measured rollout time, which is what the models predict.
    expected = sum(abs(p["rollout_s"] - p["predicted_s"]) / p["rollout_s"] for p in recorded) / len(recorded)
    assert summary["prediction_mape"] == pytest.approx(expected)
    for model in ("paper", "tail"):
        errs = [abs(p["rollout_s"] - p["predicted_by_model_s"][model]) / p["rollout_s"] for p in recorded]
        assert summary["prediction_mape_by_model"][model] == pytest.approx(sum(errs) / len(errs))


def test_router_options_and_worker_flags_leave_cached_runs_valid_and_reach_the_cluster(tmp_path):
    """Runs cached before replays took router options or extra worker flags keep their key;
    a run that sets them gets its own, and the flags reach the workers' launch arguments."""
    from benchmarks.experiments.runner import _key
    from benchmarks.harness.replay import cluster_mapping, resolve_system

    config = ReplayConfig(system="pearl", steps=1)
    assert _key(config) == _key(replace(config, router={}, engine_args=()))
    on = replace(config, router={"straggler_priority": True}, engine_args=("--enable-priority-scheduling",))
    assert _key(on) != _key(config)
    mapping = cluster_mapping(on, resolve_system(on), tmp_path)
    assert mapping["engine"]["extra_args"] == ["--enable-priority-scheduling"]
    assert "extra_args" not in cluster_mapping(config, resolve_system(config), tmp_path)["engine"]


def test_a_replay_with_carry_over_records_what_each_step_carried_and_its_policies():
    """The driver's partial rollouts in a replay: each step ends once its share of the batch
    finished; the rest are resumed first in the next step, and the step rows say which,
    with the batch's tokens by the policy that generated them. Off, nothing is carried and
    earlier runs keep their cache key."""
    from benchmarks.experiments.runner import _key

    config = ReplayConfig(system="pearl-no-borrow", segment=1, batch_size=8, group_size=4, train_step_s=60,
                          workload={"turns_median": 6, "turns_max": 10}, steps=3, follow_trace=False,
                          carry_over_share=0.5)
    assert _key(replace(config, carry_over_share=None)) == _key(replace(config, carry_over_share=None, router={}))
    assert _key(config) != _key(replace(config, carry_over_share=None))
    result = replay(config)
    steps = result["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2] and result["summary"]["errors"] == 0
    for prev, s in zip([None, *steps], steps):
        assert s["carried_in"] == (prev["carried_out"] if prev else [])
        assert len(s["trajectories"]) >= 4 and len(s["trajectories"]) + len(s["carried_out"]) == 8
        assert sum(s["tokens_by_policy"].values()) == s["generated_tokens"]
    assert any(s["carried_in"] for s in steps)
    versions = {v for s in steps for v in s["tokens_by_policy"]}
    assert versions <= {"initial"} | {s["weight_version"] for s in steps}
    # Tokens generated: trained, still in the trajectories the last step carried out, or cut
    # mid-turn (generated again after the resume).
    generated = sum(e["generated_tokens"] for e in result["engines"])
    kept = sum(s["generated_tokens"] for s in steps) + steps[-1]["carried_out_generated_tokens"]
    assert generated >= kept
