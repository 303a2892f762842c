"""Decision-quality benchmark: its grid, and how it scores choices against the best."""
from __future__ import annotations

import pytest

from benchmarks.experiments import decision_quality as dq
from benchmarks.experiments.runner import with_profile_fit
from benchmarks.harness.replay import cluster_mapping, resolve_system
from pearl_sglang.control.cluster_config import ClusterConfig


def _result(tok_s: float, *, borrowing: bool = False, topology: str = "2C", pred=None) -> dict:
    step = {"topology": topology, "borrowing": borrowing, "prediction": pred}
    return {"summary": {"mean_throughput_tok_s": tok_s, "busy_busiest_over_mean_max": tok_s / 1000},
            "steps": [dict(step, prediction=None), step]}


def test_grid_has_every_candidate_both_ways_and_both_models(tmp_path):
    assert len(dq.FULL_POINTS) == 40 and len(set(dq.FULL_POINTS)) == 40
    assert {p.regime for p in dq.FULL_POINTS} == set(dq.REGIMES)
    assert {p.batch for p in dq.FULL_POINTS} == {32, 64, 128} and {p.gpus for p in dq.FULL_POINTS} == {4, 8, 16}
    # both LLMs, every regime for each
    for llm in ("qwen3-8b", "qwen3-30b-a3b"):
        assert {p.regime for p in dq.FULL_POINTS if p.llm == llm} == set(dq.REGIMES)
    assert dq.Point("env-bound", 8, 32).label() == "env-bound g8 b32"
    assert dq.Point("env-bound", 8, 64, "qwen3-30b-a3b").label(short=True) == "env g8 b64 30b-a3b"
    grid = dq.jobs_of((dq.Point("env-bound", 8, 32),))
    assert len(grid) == 4 * 2 + 2  # colocated + 3 splits of 4 workers, borrowing on/off; 2 engines
    assert len({j.name for j in grid.values()}) == len(grid)
    for key, job in grid.items():
        cluster = ClusterConfig.from_mapping(cluster_mapping(job.config, resolve_system(job.config), tmp_path))
        if key[1] == "engine":
            assert cluster.pd_mode == "auto" and cluster.gate.enabled and cluster.makespan_model == key[2]
        else:
            # borrowing on: every step, ungated; off: never
            assert cluster.pd_mode == key[2] and cluster.gate.borrow is key[3]
            assert not (key[3] and cluster.gate.enabled)
    compute = dq.jobs_of((dq.Point("compute-bound", 4, 32),))
    assert all(j.config.workload["env_latency_median_s"] == 0.05 for j in compute.values())
    assert all(j.config.model == "qwen3-8b" for j in compute.values())
    moe = dq.jobs_of((dq.Point("compute-bound", 4, 64, "qwen3-30b-a3b"),))
    assert all(j.config.model == "qwen3-30b-a3b" and j.config.workload["env_latency_median_s"] == 0.05
               for j in moe.values())
    dense = dq.jobs_of((dq.Point("compute-bound", 4, 64),))
    assert not {j.name for j in moe.values()} & {j.name for j in dense.values()}
    assert all(ClusterConfig.from_mapping(cluster_mapping(j.config, resolve_system(j.config), tmp_path)).profile_fit
               == "all" for j in grid.values())
    name, workload = with_profile_fit("decision-quality", list(grid.values()), "workload")
    assert name == "decision-quality-profile-fit-workload"
    assert [j.name for j in workload] == [j.name for j in grid.values()]
    for key, job in zip(grid, workload):  # every replay, candidates too: placement uses the profile
        cluster = ClusterConfig.from_mapping(cluster_mapping(job.config, resolve_system(job.config), tmp_path))
        assert cluster.profile_fit == "workload"
        if key[1] == "engine":
            assert cluster.makespan_model == key[2]
    assert with_profile_fit("x", list(grid.values()), "all") == ("x", list(grid.values()))


def test_scores_choices_against_the_empirical_best_and_checks_useless_borrowing():
    point = dq.Point("env-bound", 4, 32)
    grid = dq.jobs_of((point,))
    tok = {("colocated", False): 1000.0, ("colocated", True): 990.0, ("1:1", False): 900.0, ("1:1", True): 950.0}
    results = {grid[(point, "candidate", m, b)].name: _result(v) for (m, b), v in tok.items()}
    pred = {"predicted_by_model_s": {"paper": 90.0, "tail": 105.0}, "rollout_s": 100.0}
    results[grid[(point, "engine", "paper")].name] = _result(985.0, pred={**pred, "borrowed": True})
    # The row's flag is the next step's gate answer; the step's own record decides.
    results[grid[(point, "engine", "tail")].name] = _result(1000.0, borrowing=True, pred={**pred, "borrowed": False})
    row = dq.evaluate_point(point, grid, results)
    assert (row["regime"], row["gpus"], row["batch"], row["llm"]) == point
    assert row["best"] == {"pd_mode": "colocated", "borrow": False, "tok_s": 1000.0, "busiest_over_mean": 1.0}
    assert row["paper"]["busiest_over_mean"] == 0.985
    assert row["borrowing_useless"] and row["borrow_gain"] == pytest.approx(-0.01)
    assert row["paper"]["loss"] == pytest.approx(0.015) and row["paper"]["borrowed"]
    assert row["tail"]["loss"] == 0.0
    paper, tail = dq.summarize_model([row], "paper"), dq.summarize_model([row], "tail")
    assert paper["within_2pct"] == 1 and not paper["borrow_refused_when_useless"]
    assert tail["borrow_refused_when_useless"] and tail["worst_loss"] == 0.0
    errors = dq.prediction_errors((point,), grid, results)
    assert errors["env-bound"]["steps"] == 2  # the two engines' measured steps carry predictions
    assert errors["env-bound"]["paper"] == pytest.approx(0.10) and errors["env-bound"]["tail"] == pytest.approx(0.05)
    # another LLM's replays are their own regime row
    moe = dq.Point("env-bound", 4, 32, "qwen3-30b-a3b")
    both = {**grid, **dq.jobs_of((moe,))}
    results.update({job.name: results[grid[(point, *key[1:])].name] for key, job in dq.jobs_of((moe,)).items()})
    errors = dq.prediction_errors((point, moe), both, results)
    assert list(errors) == ["env-bound", "env-bound qwen3-30b-a3b"]
    assert errors["env-bound qwen3-30b-a3b"]["steps"] == 2
