"""The soak benchmark's quick mode (100 elastic events, 1,000 multi-turn requests) in CI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_soak_quick_loses_nothing():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--quick"],
                          capture_output=True, text=True, timeout=280, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = json.loads(done.stdout[done.stdout.index("{"):])
    assert counts["requests"] == 1000 and counts["completed"] + counts["explicit_errors"] == 1000
    assert counts["lost"] == 0 and counts["mismatched"] == 0 and counts["checked_exact"] >= 100
    assert counts["routed_inactive"] == 0 and counts["held_after_train_begin"] == 0
    assert sum(counts["events"].values()) == 100 and len(counts["events"]) == 6
