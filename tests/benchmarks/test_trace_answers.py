"""Replays of a Bamboo-format trace file with every join and leave answer checked: nodes
that appear together join together, and a wrong answer fails the replay."""
from __future__ import annotations

import pytest

from benchmarks.harness import replay as harness
from benchmarks.harness.replay import ReplayConfig, WrongAnswers, replay


def trace_file(tmp_path):
    """Nothing live before 30 s, then eight nodes at once (four workers), half gone at 150 s."""
    rows = [f"30000,add,n{i}" for i in range(8)] + [f"150000,remove,n{i}" for i in range(4)]
    path = tmp_path / "burst.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def config(tmp_path) -> ReplayConfig:
    return ReplayConfig(system="pearl", trace_file=trace_file(tmp_path), max_preemptible_workers=4, minutes=5,
                        batch_size=8, group_size=4, train_step_s=60, workload={"turns_median": 6, "turns_max": 10})


def test_a_trace_file_replays_with_every_answer_true(tmp_path):
    result = replay(config(tmp_path))
    assert [(t["t_s"], t["workers"]) for t in result["trace"]["targets"]] == [(0.0, 0), (30.0, 4), (150.0, 2)]
    assert result["config"]["trace_start_h"] == 0.0
    answers = result["trace"]["answers"]
    # The four nodes join at once: the first three are carried on by the next join's growth.
    assert answers == {"joins": 4, "leaves": 2, "superseded_joins": 3, "wrong": []}, answers
    assert result["summary"]["errors"] == 0 and result["summary"]["steps"] > 0


def test_a_wrong_answer_fails_the_replay(tmp_path, monkeypatch):
    # The server answers every join as the old superseded joins did.
    monkeypatch.setattr("pearl_sglang.control.orchestrator.join_answer", lambda table, gpus, outcome: {
        "action": "join", "admitted": [], "cancelled": True, "reason": "pre-empted by a mandatory return"})
    with pytest.raises(WrongAnswers, match="4 wrong join/leave answers of 4 joins"):
        replay(config(tmp_path))


def test_the_cli_takes_a_trace_file(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert harness.main(["--trace-file", trace_file(tmp_path), "--max-preemptible-workers", "4", "--minutes", "3",
                         "--batch-size", "8", "--group-size", "4", "--train-step-s", "60", "--steps", "1",
                         "--quiet", "--out", str(out)]) == 0
    assert "burst.csv" in capsys.readouterr().out and out.exists()
