"""PD sweep (the paper's Figure 2c): colocation against every P:D split of 8 TP2 workers
(16 GPUs) at several batch sizes, rollout throughput (generated tokens per rollout
second) over the steps after the first."""
from __future__ import annotations

import argparse

from benchmarks.experiments import fixed
from benchmarks.experiments.report import md_table, pyplot, write
from benchmarks.experiments.runner import RESULTS, run_jobs

NAME = "pd-sweep"
GPUS = 16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments pd-sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        batches, modes, steps, name = (64,), ["colocated", "2:6", "4:4", "6:2"], 2, NAME + "-quick"
    else:
        batches, modes, steps, name = (32, 64, 128), fixed.splits(GPUS // 2), 2, NAME
    grid = {(b, m): fixed.job(gpus=GPUS, pd_mode=m, batch=b, steps=steps) for b in batches for m in modes}
    results = run_jobs(name, list(grid.values()), parallel=args.parallel, cache_dir=fixed.CACHE)
    tput = {k: fixed.rollout_tok_s(results[j.name]) for k, j in grid.items()}
    rows, cells = [], []
    for m in modes:
        row = [fixed.mode_label(m, GPUS)]
        for b in batches:
            best = max(tput[(b, x)] for x in modes)
            row.append(f"{tput[(b, m)]:.0f} ({tput[(b, m)] / tput[(b, 'colocated')]:.2f}x)"
                       + (" **best**" if tput[(b, m)] == best else ""))
            cells.append({"batch": b, "pd_mode": m, "label": fixed.mode_label(m, GPUS),
                          "rollout_tok_s": tput[(b, m)], "vs_colocated": tput[(b, m)] / tput[(b, "colocated")]})
        rows.append(row)
    md = (f"# PD sweep (Figure 2c)\n\n8 TP2 workers (16 GPUs), Qwen3-8B profile, rewrite_fraction "
          f"{fixed.REWRITE} (prefill-heavy), {steps} steps (the first excluded). Rollout throughput in "
          f"generated tok/s (ratio to colocated).\n\n"
          + md_table(["configuration"] + [f"batch {b}" for b in batches], rows))
    write(name, {"batches": batches, "modes": modes, "steps": steps, "cells": cells}, md)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for b in batches:
        ax.plot([fixed.mode_label(m, GPUS) for m in modes], [tput[(b, m)] / tput[(b, "colocated")] for m in modes],
                marker="o", label=f"batch {b}")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("rollout throughput / colocated")
    ax.set_title("Colocated vs every P:D split of 8 TP2 workers", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / name / "pd_sweep.png", dpi=110)
    plt.close(fig)
    return 0
