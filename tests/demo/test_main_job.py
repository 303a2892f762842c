"""PEARL's main job end to end, shortened: a real router process launching emulated worker
processes, the agentic RL loop with train hooks, trace replay, summary and plot."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(400)


def _leftovers() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "pearl_sglang.(emulator|router)"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.parametrize("system", ["pearl", "roll"])
def test_main_job_runs_and_cleans_up(tmp_path, system):
    before = _leftovers()
    # PEARL's pool is one reserved worker and at most one preemptible one, so the two lent
    # workers double it and the gate's own check says borrowing pays: the last step replayed
    # with them serving from ~150 s ends 25.8-26.6 s sooner (4 runs; T_toggle 9.44 s). On two
    # reserved workers and two preemptible ones it ended 6.8-14.7 s sooner, and whether this
    # demo borrowed was a coin toss (a refused borrow is then the right answer, not a bug).
    # At batch 8 the gate rightly never borrows. 50x, not 100x: the workers' start-up runs in
    # real time and each real second reads as 100 emulated ones.
    pool = ["--dedicated-workers", "1", "--max-preemptible-workers", "1"] if system == "pearl" else \
        ["--dedicated-workers", "2", "--max-preemptible-workers", "2"]
    args = [sys.executable, "-m", "pearl_sglang.demo", "--system", system, "--minutes", "25",
            "--time-scale", "50", "--batch-size", "16", "--group-size", "4", *pool,
            "--overlap-workers", "2", "--train-step-s", "60", "--out", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "summary" in done.stdout and "mean throughput" in done.stdout
    (run,) = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["summary"]["steps"] >= 2 and summary["summary"]["errors"] == 0
    assert all(step["throughput"] > 0 for step in summary["steps"])
    assert (run / "throughput.png").stat().st_size > 10_000
    roles = summary["roles"]
    if system == "pearl":
        assert any(r.get("oC", 0) + r.get("oP", 0) + r.get("oD", 0) for r in roles), \
            "never borrowed:\n" + done.stdout[-3000:]
        # The first borrow follows an unborrowed step, so the gate's replay check ran and said so.
        assert re.search(r"overlap workers serving from \d+ s \(requests x[\d.]+\) ends [\d.]+ s sooner", done.stdout)
    else:
        assert all(not r.get("oC") for r in roles) and max(r.get("C", 0) for r in roles) == 2
    time.sleep(0.5)
    assert _leftovers() == before
