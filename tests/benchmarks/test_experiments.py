"""The experiment runner: runs replays in worker processes, caches them by configuration,
and a fixed P:D ratio really pins the topology."""
from __future__ import annotations

import json

import pytest
from dataclasses import asdict, replace

from benchmarks.experiments import fixed, floor, report, runner
from benchmarks.harness.replay import resolve_system

TINY = {"minutes": 10, "group_size": 4, "train_step_s": 60, "workload": {"turns_median": 4, "turns_max": 6}}


def test_fixed_jobs_run_once_and_pin_the_topology(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "RESULTS", tmp_path)
    jobs = [fixed.job(gpus=4, pd_mode=m, batch=4, steps=2) for m in ("1:1", "colocated")]
    jobs = [replace(j, config=replace(j.config, **TINY)) for j in jobs]
    first = runner.run_jobs("exp", jobs, parallel=2, cache_dir="shared")
    assert [fixed.final_topology(first[j.name]) for j in jobs] == ["1P1D", "2C"]
    for j in jobs:
        summary = first[j.name]["summary"]
        assert summary["errors"] == 0 and summary["rollout_throughput_tok_s"] > 0
        # no step can beat its slowest trajectory running alone on an idle worker
        assert floor.over_floor(first[j.name]) >= 0.999
        assert (tmp_path / "shared" / "runs" / f"{j.name}.json").exists()
    again = runner.run_jobs("exp", jobs, parallel=2, cache_dir="shared")
    assert "2 cached, 0 to run" in capsys.readouterr().out
    assert again[jobs[0].name]["run"] == first[jobs[0].name]["run"]
    # a changed configuration is not served from the cache
    changed = [replace(jobs[0], config=replace(jobs[0].config, seed=1))]
    assert "0 cached, 1 to run" in (runner.run_jobs("exp", changed, parallel=1, cache_dir="shared"),
                                    capsys.readouterr().out)[1]


def test_markdown_table_formats_cells():
    md = report.md_table(["a", "b"], [[1.23456, 1234.5], ["x", 3]])
    assert md.splitlines() == ["| a | b |", "|---|---|", "| 1.23 | 1234 |", "| x | 3 |"]
    assert json.loads(json.dumps({"ok": md}))


def test_every_experiment_builds_valid_cluster_configs(tmp_path):
    from benchmarks.experiments import ablation, elastic, ratio, sensitivity
    from benchmarks.harness.replay import cluster_mapping, resolve_system
    from pearl_sglang.control.cluster_config import ClusterConfig

    jobs = elastic.jobs(elastic.Plan())  # the quick plan has its own cache folder
    jobs += [fixed.job(gpus=g, pd_mode=m, batch=64) for g in ratio.POINTS for m in fixed.splits(g // 2)]
    jobs += [fixed.job(gpus=g, pd_mode=mode, batch=64, system=s)
             for g in ablation.SIZES for _, s, mode in ablation.VARIANTS]
    jobs += [fixed.job(gpus=sensitivity.GPUS, pd_mode=mode, batch=64, system=s, max_len=8192)
             for s, mode in sensitivity.SYSTEMS.values()]
    by_name = {}
    for j in jobs:  # a name is a cache file: experiments may share a run, never a name for two runs
        assert by_name.setdefault(j.name, j.config) == j.config, j.name
    for j in jobs:
        sysdef = resolve_system(j.config)
        ClusterConfig.from_mapping(cluster_mapping(j.config, sysdef, tmp_path))  # validates
    assert fixed.splits(4) == ["colocated", "1:3", "2:2", "3:1"]
    assert fixed.mode_label("3:5", 16) == "3P5D" and fixed.mode_label("colocated", 16) == "8C"


def test_suite_command_lists_experiments(capsys):
    from benchmarks.experiments.__main__ import main
    assert main(["--help"]) == 0
    assert main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert "pd-sweep" in err and "decision-quality" in err


def test_all_runs_every_experiments_replays_in_one_pool(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "RESULTS", tmp_path)
    jobs = [fixed.job(gpus=2, pd_mode="colocated", batch=4, steps=1, system=s) for s in ("pearl", "pearl-no-borrow")]
    jobs = [replace(j, config=replace(j.config, **TINY)) for j in jobs]

    def experiment(argv):
        results = runner.run_jobs("exp", jobs, parallel=1, cache_dir="shared")
        assert set(results) == {j.name for j in jobs}
        return 0

    renamed = [replace(j, name=f"other-{j.name}") for j in jobs]

    def another(argv):  # the same configurations under other names, in its own cache
        assert set(runner.run_jobs("another", renamed, parallel=1)) == {j.name for j in renamed}
        return 0

    planned = runner.plan_jobs(experiment, [])  # collects, runs nothing
    assert [(name, [j.name for j in js]) for name, _, js in planned] == [("exp", [j.name for j in jobs])]
    assert not (tmp_path / "shared").exists()
    # A job two experiments share runs once, under the same name or another.
    runner.run_all(planned + planned + runner.plan_jobs(another, []), parallel=2)
    assert "[all] 2 runs to do" in capsys.readouterr().out
    assert experiment([]) == 0 and another([]) == 0
    out = capsys.readouterr().out
    assert "[exp] 2 runs, 2 cached, 0 to run" in out and "[another] 2 runs, 2 cached, 0 to run" in out


def test_roll_runs_once_per_model_for_every_segment():
    from benchmarks.experiments import elastic

    names = [j.name for j in elastic.jobs(elastic.Plan())]
    assert len(names) == len(set(names)) == 2 * (1 + 3 * 3)
    assert elastic.run_name("qwen3-8b", 2, "roll") == "qwen3-8b-roll"
    assert elastic.run_name("qwen3-8b", 2, "pearl") == "qwen3-8b-seg2-pearl"


def test_fixed_experiments_share_the_runs_they_have_in_common():
    from benchmarks.experiments import ablation, ratio, sensitivity

    def names(module):
        return {j.name for _, _, jobs in runner.plan_jobs(module.main, []) for j in jobs}

    ratio_runs, ablation_runs, sensitivity_runs = names(ratio), names(ablation), names(sensitivity)
    assert {f"pearl-no-borrow-g{g}-{m}-b64-s{fixed.STEPS}" for g in (4, 8, 16) for m in ("colocated", "auto")} \
        <= ratio_runs & ablation_runs
    assert {f"pearl-no-borrow-g8-colocated-b64-s{fixed.STEPS}", f"pearl-g8-auto-b64-s{fixed.STEPS}"} \
        <= sensitivity_runs & (ratio_runs | ablation_runs)


def test_the_stragglers_ablation_compares_each_mechanism_on_the_same_pools():
    from benchmarks.experiments import stragglers

    [(name, _, jobs)] = runner.plan_jobs(stragglers.main, ["--quick"])
    assert name == "stragglers-quick" and len(jobs) == len(stragglers.SYSTEMS) * 2 * len(stragglers.VARIANTS)
    by_name = {j.name: j.config for j in jobs}
    off, both = by_name["pearl-no-borrow-g8-colocated-b32-s2"], by_name["pearl-no-borrow-g8-colocated-b32-s2-both"]
    assert off.router == {} and off.engine_args == ()
    # The same system and workload, only the straggler options differ.
    assert replace(both, router={}, engine_args=()) == off
    assert both.router == {"straggler_priority": True, "straggler_isolation": True}
    assert both.engine_args == ("--enable-priority-scheduling",)
    carry = by_name["pearl-no-borrow-g8-colocated-b32-s2-carry-over"]
    assert carry.carry_over_share == stragglers.CARRY_OVER_SHARE and off.carry_over_share is None
    assert replace(carry, carry_over_share=None) == off
    # PEARL with borrowing runs the same variants on the same pools; only the system differs.
    assert stragglers.SYSTEMS == ("pearl-no-borrow", "pearl")
    assert replace(by_name["pearl-g8-colocated-b32-s2-both"], system="pearl-no-borrow") == both
    [(_, _, some)] = runner.plan_jobs(stragglers.main, ["--quick", "--variants", "carry-over"])
    assert sorted(j.name for j in some) == sorted(n for n in by_name if n.endswith(("-s2", "-carry-over")))
    with pytest.raises(SystemExit):
        runner.plan_jobs(stragglers.main, ["--quick", "--variants", "carryover"])
    # Disaggregated pools: the same grid, pinned to PD mode (the engine's ratio), results apart.
    [(pd_name, _, pd_jobs)] = runner.plan_jobs(stragglers.main, ["--quick", "--pd-mode", "disaggregated"])
    assert pd_name == "stragglers-quick-disaggregated" and len(pd_jobs) == len(jobs)
    pd_off = {j.name: j.config for j in pd_jobs}["pearl-no-borrow-g8-disaggregated-b32-s2"]
    assert pd_off.pd_mode == "disaggregated" and replace(pd_off, pd_mode="colocated") == off
    with pytest.raises(SystemExit):
        runner.plan_jobs(stragglers.main, ["--quick", "--pd-mode", "1:3"])
    # The sweep's variants run only when named, with their options over the plain system's.
    assert not set(stragglers.SWEEP_VARIANTS) & {n.rsplit("-s2-", 1)[-1] for n in by_name}
    [(_, _, swept)] = runner.plan_jobs(stragglers.main, ["--quick", "--variants", "isolation-share25-margin06"])
    wide = {j.name: j.config for j in swept}["pearl-g8-colocated-b32-s2-isolation-share25-margin06"]
    assert wide.router == {"straggler_isolation": True, "straggler_share": 0.25, "straggler_home_margin": 0.6}
    assert replace(wide, router={}) == by_name["pearl-g8-colocated-b32-s2"]
    # More workload draws: each cell once per seed, seed 0 under its old name.
    [(_, _, drawn)] = runner.plan_jobs(stragglers.main, ["--quick", "--variants", "isolation", "--seeds", "0,2"])
    seeds = {j.name: j.config.seed for j in drawn}
    assert seeds["pearl-g8-colocated-b32-s2-isolation"] == 0 and seeds["pearl-g8-colocated-b32-s2-isolation-seed2"] == 2
    assert len(drawn) == len(stragglers.SYSTEMS) * 2 * 2 * 2
    assert replace(by_name["pearl-g8-colocated-b32-s2"], seed=2) == \
        {j.name: j.config for j in drawn}["pearl-g8-colocated-b32-s2-seed2"]
    for bad in ("1,x", "-1", ""):
        with pytest.raises(SystemExit):
            runner.plan_jobs(stragglers.main, ["--quick", "--seeds", bad])


def test_the_stragglers_ablation_runs_rlboost_and_pearl_on_trace_segments():
    """``--segments``: the elastic replays' systems, their preemptible workers following the
    trace, with the same variants; only the system and the segment differ between cells."""
    from benchmarks.experiments import stragglers

    [(name, _, jobs)] = runner.plan_jobs(stragglers.main, ["--quick", "--segments", "1,3", "--variants", "isolation"])
    assert name == "stragglers-quick-trace" and len(jobs) == 2 * 2 * 2
    by_name = {j.name: j.config for j in jobs}
    off = by_name["rlboost-seg1-b32-s2"]
    assert (off.system, off.segment, off.batch_size, off.steps) == ("rlboost", 1, 32, 2)
    assert off.follow_trace is None and off.dedicated_gpus is None and off.pd_mode is None
    assert resolve_system(off).follows_trace and resolve_system(off).pd_mode == "colocated"
    assert replace(by_name["pearl-seg3-b32-s2-isolation"], system="rlboost", segment=1, router={}) == off
    assert by_name["pearl-seg3-b32-s2-isolation"].router == {"straggler_isolation": True}
    for bad in (["--segments", "4"], ["--segments", "1", "--pd-mode", "disaggregated"]):
        with pytest.raises(SystemExit):
            runner.plan_jobs(stragglers.main, ["--quick", *bad])


def test_the_stragglers_table_takes_the_cut_from_the_means_over_seeds(tmp_path, monkeypatch):
    """The committed seed-0 runs stand in for a second draw: the means equal seed 0's, and
    a third draw of different runs moves them."""
    from benchmarks.experiments import stragglers

    runs = runner.RESULTS / "stragglers" / "runs"

    def committed(name, jobs, parallel):
        out = {}
        for j in jobs:
            stem = j.name.removesuffix(f"-seed{j.config.seed}")
            # Seed 2's isolation runs are the `both` runs, so its means differ.
            if j.config.seed == 2 and stem.endswith("-isolation"):
                stem = stem.removesuffix("-isolation") + "-both"
            out[j.name] = json.loads((runs / f"{stem}.json").read_text())
        return out

    monkeypatch.setattr(stragglers, "run_jobs", committed)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert stragglers.main(["--variants", "isolation", "--seeds", "0,1,2"]) == 0
    summary = json.loads((tmp_path / "stragglers" / "summary.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and len(summary["over_seeds"]) == len(summary["cells"]) == 8
    for cell, m in zip(summary["cells"], summary["over_seeds"]):
        assert (cell["system"], cell["gpus"], cell["variant"]) == (m["system"], m["gpus"], m["variant"])
        x = m["rollout_over_floor"]
        assert x[0] == x[1] == cell["rollout_over_floor"] and m["mean_rollout_over_floor"] == pytest.approx(sum(x) / 3)
        off = next(o for o in summary["over_seeds"] if (o["system"], o["gpus"], o["variant"])
                   == (m["system"], m["gpus"], "off"))
        assert m["cut_of_distance_to_1"] == pytest.approx(
            (off["mean_rollout_over_floor"] - m["mean_rollout_over_floor"]) / (off["mean_rollout_over_floor"] - 1))
        assert m["tok_s_vs_off"] == pytest.approx(m["mean_tok_s"] / off["mean_tok_s"])
    assert any(m["rollout_over_floor"][2] != m["rollout_over_floor"][0] for m in summary["over_seeds"])
    assert "Over the workload draws (seeds 0 / 1 / 2" in (tmp_path / "stragglers" / "stragglers.md").read_text()


def test_carry_cost_counts_stale_and_thrown_away_tokens_and_busy_share_the_pool_at_work():
    from benchmarks.experiments import stragglers

    def step(k, tokens_by_policy, carried_in=(), carried_out_tokens=0, generated=None):
        return {"step": k, "weight_version": f"v{k}", "tokens_by_policy": tokens_by_policy,
                "carried_in": list(carried_in), "carried_out_generated_tokens": carried_out_tokens,
                "generated_tokens": sum(tokens_by_policy.values()) if generated is None else generated,
                "rollout_s": 100.0, "utilization": {"workers": {"0": {"busy_s": 90.0}, "1": {"busy_s": 60.0}}}}

    # Step s trains on the policy step s-1 pushed: in step 2, v1 is on-policy, v0 one behind,
    # initial two; in step 1, v0 is on-policy and initial one behind.
    steps = [step(0, {"initial": 100}, carried_out_tokens=30),
             step(1, {"initial": 40, "v0": 60}, carried_in=["traj-3"], carried_out_tokens=10),
             step(2, {"initial": 10, "v0": 30, "v1": 60}, carried_in=["traj-9"], carried_out_tokens=5)]
    result = {"steps": steps, "engines": [{"generated_tokens": 250}, {"generated_tokens": 60}]}
    cost = stragglers.carry_cost(result)
    assert cost["carried_in"] == [1, 1]
    assert cost["tokens_by_staleness"] == pytest.approx({0: 120 / 200, 1: 70 / 200, 2: 10 / 200})
    # 310 generated, 300 trained, 5 still in the last step's carried-out trajectories.
    assert cost["thrown_away_tokens"] == 5 and cost["thrown_away_share"] == pytest.approx(5 / 310)
    assert stragglers.busy_share(result) == [(0.6, 0.9), (0.6, 0.9)]
    del steps[1]["tokens_by_policy"]  # recorded before the harness kept it
    assert stragglers.carry_cost(result) is None


def test_tail_mechanism_names_the_last_trajectory_and_its_contention():
    from benchmarks.experiments import fixed, stragglers
    from benchmarks.experiments.floor import trajectory_floor_s
    from pearl_sglang.emulator.profile import load_profile
    from pearl_sglang.workload.swe import SweSampler

    config = replace(fixed.job(gpus=8, pd_mode="colocated", batch=4, steps=2).config, group_size=4)
    sampler, cost = SweSampler(config.sweworkload()), load_profile(config.emulator_profile()).cost
    alone = {i: trajectory_floor_s(sampler, i, cost) for i in range(4, 8)}
    # Step 1's trajectories 4-7: each took twice its time alone in requests, the last one three times.
    rows = [[f"traj-{i}", 3, 2 * (a - e), e] for i, (a, e) in alone.items()]
    last = max(range(4), key=lambda k: rows[k][2] + rows[k][3])
    rows[last][2] = 3 * (alone[4 + last][0] - alone[4 + last][1])
    result = {"config": asdict(config), "steps": [{"step": 0}, {"step": 1, "trajectories": rows}]}
    [m] = stragglers.tail_mechanism(result)
    assert m["last"]["trajectory"] == rows[last][0] and m["last"]["contention"] == pytest.approx(3.0)
    assert m["tail_contention"] == pytest.approx(3.0) and m["rest_contention"] == pytest.approx(2.0)
    assert (m["size"], m["tail_size"]) == (4, 1)
    assert m["budget_cut"] == sum(sampler.planned_turns(i) < sampler.turn_count(i) for i in range(4, 8))
    assert m["tail_budget_cut"] == int(sampler.planned_turns(4 + last) < sampler.turn_count(4 + last))


def test_prediction_hits_read_the_sampled_stragglers_against_the_finish_order():
    from benchmarks.experiments import stragglers

    # 20 trajectories; the last tenth to finish (2 of them) are traj-18 and traj-19.
    rows = [[f"traj-{i}", 3, 10.0 + i, 1.0] for i in range(20)]
    samples = [
        {"t_s": 0.0, "stragglers": []},                                        # nothing predicted yet
        {"t_s": 60.0, "running": 20, "stragglers": ["traj-19", "traj-3"]},     # half right, before the tail
        {"t_s": 120.0, "running": 16, "stragglers": ["traj-19", "traj-18"]},   # a fifth done: both right
        {"t_s": 180.0, "running": 10, "stragglers": ["traj-5", "traj-6"]},     # both wrong
        {"t_s": 240.0, "running": 4, "stragglers": ["traj-40"]},               # another step's
    ]
    result = {"steps": [{"step": 0}, {"step": 1, "trajectories": rows}], "samples": samples}
    [h] = stragglers.prediction_hits(result)
    assert (h["samples"], h["tail_samples"]) == (3, 2)
    assert h["hits"] == pytest.approx((0.5 + 1 + 0) / 3) and h["tail_hits"] == pytest.approx(0.5)
    result["samples"] = samples[:1]  # recorded before the harness kept them
    [h] = stragglers.prediction_hits(result)
    assert h["hits"] is None and h["tail_hits"] is None and h["samples"] == 0
