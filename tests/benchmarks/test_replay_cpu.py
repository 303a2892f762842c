"""The CPU-seconds bench: a pair of tiny replays of one checkout, alternated, compared."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.replay_cpu import main

REPO = Path(__file__).resolve().parents[2]


def test_a_pair_of_replays_of_one_checkout_is_identical(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rc = main(["--before", str(REPO), "--after", str(REPO), "--runs", "roll:qwen3-8b", "--minutes", "3",
               "--json", str(out), "--batch-size", "8", "--group-size", "4"])
    assert rc == 0, capsys.readouterr().out
    (row,) = json.loads(out.read_text())
    assert row["run"] == "roll:qwen3-8b" and row["identical"] is True
    assert row["before_cpu_s"] > 0 and row["after_cpu_s"] > 0
    assert row["loop_steps"][0] == row["loop_steps"][1] > 0
    assert "results identical" in capsys.readouterr().out
