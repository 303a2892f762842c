"""The router program keeps the collector off its start-up objects (``settle_heap``); run
in a child interpreter so this process's collector is left as it is."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_settle_heap_freezes_start_up_and_sets_the_thresholds():
    code = ("import gc; from pearl_sglang.server.cli import GC_THRESHOLDS, settle_heap\n"
            "before = gc.get_freeze_count(); settle_heap()\n"
            "print(before, gc.get_freeze_count(), gc.get_threshold() == GC_THRESHOLDS, GC_THRESHOLDS[0] > 700)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, thresholds, raised = out.stdout.split()
    assert int(before) == 0 and int(after) > 10_000  # the imported modules' objects
    assert thresholds == "True" and raised == "True"
