"""The fit behind the tail floor's z: its statistics on hand-built steps, and that the
model's constant is the fitted one."""
import json
import math
from pathlib import Path

import pytest

from benchmarks import tail_floor_fit as fit
from pearl_sglang.core.tail import DEFAULT_Z, TurnSpread


def test_turn_stats_recover_the_per_turn_mean_and_spread():
    # Turns of 10 s exactly: no spread; the slowest is the one with most turns.
    s = fit.turn_stats([["a", 4, 30.0, 10.0], ["b", 9, 60.0, 30.0], ["c", 1, 5.0, 5.0]])
    assert s == {"S": 9, "mean_s": 10.0, "std_s": 0.0, "slowest_s": 90.0, "trajectories": 3}
    # One trajectory of 4 turns 8 s over the mean of the others: sd^2 = mean((T - N m)^2 / N).
    s = fit.turn_stats([["a", 4, 40.0, 0.0], ["b", 4, 48.0, 0.0]])
    assert s["mean_s"] == 11.0
    assert s["std_s"] == pytest.approx(math.sqrt((16 / 4 + 16 / 4) / 2))


def test_errors_are_zero_where_the_floor_is_exact():
    step = [["a", 5, 50.0, 0.0], ["b", 3, 30.0, 0.0]]
    data = fit.pairs([{"steps": [{"trajectories": step}, {"trajectories": step}, {"trajectories": None}]}])
    assert len(data) == 1
    assert fit.errors(data, 0.0) == {"z": 0.0, "bias": 0.0, "mape": 0.0}


def test_the_models_z_is_the_fitted_one():
    summary = Path(fit.RESULTS) / "tail-floor-fit" / "summary.json"
    result = json.loads(summary.read_text())
    assert result["best_z"] == DEFAULT_Z == TurnSpread(1.0).z
    assert result["steps"] >= 16
