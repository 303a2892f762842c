"""``python -m benchmarks.tail_floor_fit``: where the tail-aware model's ``z`` comes from.

The latency floor (``core.tail``) predicts the slowest trajectory as ``S`` turns (the most
turns any trajectory had) at the mean turn time, plus ``z * sqrt(S)`` per-turn standard
deviations.  This fits ``z`` on replays that are not the decision-quality grid: the
stragglers ablation's (``results/stragglers/runs``), whose step rows hold each
trajectory's turns and its time in requests and in the environment.  For every step after
the first, the previous step's trajectories give the per-turn mean ``m = sum(T) / sum(N)``,
the per-turn spread ``sd^2 = mean((T_i - N_i m)^2 / N_i)`` (a trajectory of ``N`` turns
varies as ``N sd^2``) and ``S = max N``, as the control plane would have them at
``train_begin``; the prediction is compared with the step's slowest trajectory.  Per-turn
time is measured here, not modelled, so the fit is of the spread term alone.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Iterable

from benchmarks.experiments.report import md_table
from benchmarks.experiments.runner import RESULTS
from pearl_sglang.core.tail import DEFAULT_Z, trajectory_latency

ZS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


def turn_stats(trajectories: Iterable[list[Any]]) -> dict[str, float]:
    """Per-turn mean and spread of one step's trajectories ``[id, turns, request_s, env_s]``."""
    rows = [(int(t[1]), float(t[2]) + float(t[3])) for t in trajectories if int(t[1]) > 0]
    turns = sum(n for n, _ in rows)
    mean = sum(x for _, x in rows) / turns
    var = sum((x - n * mean) ** 2 / n for n, x in rows) / len(rows)
    return {"S": max(n for n, _ in rows), "mean_s": mean, "std_s": math.sqrt(var),
            "slowest_s": max(x for _, x in rows), "trajectories": len(rows)}


def pairs(runs: Iterable[dict[str, Any]]) -> list[tuple[dict[str, float], dict[str, float]]]:
    """(previous step, step) statistics of every step after a run's first."""
    out = []
    for run in runs:
        stats = [turn_stats(s["trajectories"]) for s in run["steps"] if s.get("trajectories")]
        out += list(zip(stats, stats[1:]))
    return out


def errors(data: list[tuple[dict[str, float], dict[str, float]]], z: float) -> dict[str, float]:
    rel = [(trajectory_latency(prev["S"], prev["mean_s"], prev["std_s"], z) - cur["slowest_s"]) / cur["slowest_s"]
           for prev, cur in data]
    return {"z": z, "bias": sum(rel) / len(rel), "mape": sum(abs(e) for e in rel) / len(rel)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tail_floor_fit", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RESULTS / "stragglers" / "runs")
    args = parser.parse_args(argv)
    files = sorted(args.runs.glob("*.json"))
    data = pairs(json.loads(f.read_text()) for f in files)
    if not data:
        parser.error(f"no replays with per-trajectory step rows under {args.runs}")
    table = [errors(data, z) for z in ZS]
    best = min(table, key=lambda r: r["mape"])
    summary = {"runs": [f.name for f in files], "steps": len(data), "by_z": table, "best_z": best["z"],
               "default_z": DEFAULT_Z}
    out = RESULTS / "tail-floor-fit"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    md = (f"# Tail floor: fitting z\n\n{len(data)} steps of {len(files)} replays ({args.runs.name}); prediction of each "
          f"step's slowest trajectory from the previous step's turns.\n\n"
          + md_table(["z", "bias", "MAPE"], [[r["z"], f"{r['bias']:+.1%}", f"{r['mape']:.1%}"] for r in table])
          + f"\nLowest MAPE at z = {best['z']}; the model's default is z = {DEFAULT_Z}.\n")
    (out / "tail-floor-fit.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
