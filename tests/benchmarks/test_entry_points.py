"""Every benchmark starts: ``--help`` through the way the README runs it (``python -m
benchmarks.<name>`` or ``python benchmarks/<name>.py``) exits 0. A moved import once left
``router_overhead.py`` failing at its first line for weeks, with no test to say so."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_benchmark_starts(name: str) -> None:
    runs = ([sys.executable, "-m", f"benchmarks.{name}", "--help"],
            [sys.executable, f"benchmarks/{name}.py", "--help"])
    errors = []
    for argv in runs:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return
        errors.append(f"{' '.join(argv[1:])}: {done.stderr.strip().splitlines()[-1:]}")
    pytest.fail(f"benchmarks/{name}.py does not start either way: {errors}")
