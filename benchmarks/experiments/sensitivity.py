"""Workload sensitivity (the paper's Figure 8): PEARL's gain over ROLL and RLBoost+ as the
batch size (32-128) and the maximum trajectory length (8K-32K tokens) change, on trace
segment 1 with the Qwen3-8B profile."""
from __future__ import annotations

import argparse

from benchmarks.experiments.report import COLORS, SYSTEM_LABELS, md_table, pyplot, write
from benchmarks.experiments.runner import RESULTS, Job, run_jobs
from benchmarks.harness.replay import ReplayConfig

NAME = "sensitivity"
SYSTEMS = ("roll", "rlboost", "pearl")
REWRITE = 0.9


def _job(system: str, batch: int, max_len: int, minutes: float) -> Job:
    return Job(f"{system}-b{batch}-len{max_len}-m{minutes:g}",
               ReplayConfig(system=system, segment=1, minutes=minutes, batch_size=batch, rewrite_fraction=REWRITE,
                            workload={"max_trajectory_tokens": max_len}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments sensitivity", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        settings, minutes, name = [(32, 32768), (32, 8192)], 30.0, NAME + "-quick"
    else:
        settings, minutes, name = [(32, 32768), (64, 32768), (128, 32768), (64, 8192), (64, 16384)], 45.0, NAME
    grid = {(b, n, s): _job(s, b, n, minutes) for b, n in settings for s in SYSTEMS}
    results = run_jobs(name, list(grid.values()), parallel=args.parallel)
    tput = {k: results[j.name]["summary"]["mean_throughput_tok_s"] for k, j in grid.items()}
    rows, cells = [], []
    for b, n in settings:
        base = tput[(b, n, "roll")]
        cell = {"batch": b, "max_trajectory_tokens": n, **{s: tput[(b, n, s)] for s in SYSTEMS},
                "pearl_vs_roll": tput[(b, n, "pearl")] / base,
                "pearl_vs_rlboost": tput[(b, n, "pearl")] / tput[(b, n, "rlboost")]}
        cells.append(cell)
        rows.append([b, n] + [f"{tput[(b, n, s)]:.0f}" for s in SYSTEMS]
                    + [f"{cell['pearl_vs_roll']:.2f}x", f"{cell['pearl_vs_rlboost']:.2f}x"])
    md = (f"# Workload sensitivity (Figure 8)\n\nSegment 1, Qwen3-8B profile, {minutes:g}-minute windows, "
          f"rewrite_fraction {REWRITE}. Mean step throughput in tok/s.\n\n"
          + md_table(["batch", "max trajectory tokens"] + [SYSTEM_LABELS[s] for s in SYSTEMS]
                     + ["PEARL / ROLL", "PEARL / RLBoost+"], rows))
    write(name, {"minutes": minutes, "settings": settings, "cells": cells}, md)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    labels = [f"B{b}\n{n // 1024}K" for b, n in settings]
    for i, s in enumerate(SYSTEMS):
        ax.bar([j + (i - 1) * 0.27 for j in range(len(settings))],
               [tput[(b, n, s)] / tput[(b, n, "roll")] for b, n in settings], 0.27,
               color=COLORS[s], label=SYSTEM_LABELS[s])
    ax.set_xticks(range(len(settings)), labels)
    ax.set_ylabel("throughput / ROLL")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / name / "sensitivity.png", dpi=110)
    plt.close(fig)
    return 0
