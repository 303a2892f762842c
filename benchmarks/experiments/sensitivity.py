"""Workload sensitivity (the paper's Figure 8): PEARL against RLBoost+ as the batch size
(32-128) and the maximum trajectory length (8K-32K tokens) change; Qwen3-8B profile,
16 training GPUs and 8 reserved rollout GPUs, as in the paper.

With no preemptible GPUs, RLBoost+ is a colocated data-parallel pool that does not borrow;
PEARL adds adaptive PD and gated borrowing of the training GPUs."""
from __future__ import annotations


from benchmarks.experiments import fixed
from benchmarks.experiments.floor import over_floor, utilization_cells
from benchmarks.experiments.report import COLORS, grouped_bars, md_table, pyplot, save, write
from benchmarks.experiments.runner import RESULTS, arg_parser, results_name, run_jobs

NAME = "sensitivity"
GPUS = 8
SYSTEMS = {"rlboost": ("pearl-no-borrow", "colocated"), "pearl": ("pearl", "auto")}
LABELS = {"rlboost": "RLBoost+", "pearl": "PEARL"}


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser("sensitivity", __doc__)
    args = parser.parse_args(argv)
    if args.quick:
        settings = [(32, 32768), (32, 8192)]
    else:
        settings = [(32, 32768), (64, 32768), (128, 32768), (64, 8192), (64, 16384)]
    name = results_name(NAME, quick=args.quick, preset=args.preset)
    grid = {(b, n, s): fixed.job(gpus=GPUS, pd_mode=mode, batch=b, system=system, max_len=n, preset=args.preset)
            for b, n in settings for s, (system, mode) in SYSTEMS.items()}
    results = run_jobs(name, list(grid.values()), parallel=args.parallel,
                       cache_dir=fixed.cache(args.quick, args.preset))
    tput = {k: results[j.name]["summary"]["mean_throughput_tok_s"] for k, j in grid.items()}
    rows, cells = [], []
    for b, n in settings:
        gain = tput[(b, n, "pearl")] / tput[(b, n, "rlboost")]
        pearl = results[grid[(b, n, "pearl")].name]
        cells.append({"batch": b, "max_trajectory_tokens": n, "rlboost_tok_s": tput[(b, n, "rlboost")],
                      "pearl_tok_s": tput[(b, n, "pearl")], "pearl_vs_rlboost": gain,
                      "pearl_topologies": sorted({s["topology"] for s in pearl["steps"]}),
                      "pearl_borrowed_steps": sum(bool(s["borrowing"]) for s in pearl["steps"])})
        floors = {s: over_floor(results[grid[(b, n, s)].name]) for s in SYSTEMS}
        cells[-1]["rollout_over_floor"] = floors
        busy = {s: utilization_cells(results[grid[(b, n, s)].name])[0] for s in SYSTEMS}
        cells[-1]["busy_busiest_over_mean_max"] = {
            s: results[grid[(b, n, s)].name]["summary"]["busy_busiest_over_mean_max"] for s in SYSTEMS}
        rows.append([b, n, f"{tput[(b, n, 'rlboost')]:.0f}", f"{tput[(b, n, 'pearl')]:.0f}", f"{gain:.2f}x",
                     ", ".join(cells[-1]["pearl_topologies"]), f"{busy['rlboost']} / {busy['pearl']}",
                     f"{floors['rlboost']:.2f} / {floors['pearl']:.2f}"])
    md = (f"# Workload sensitivity (Figure 8)\n\n8 reserved rollout GPUs, 16 training GPUs, Qwen3-8B profile, "
          f"preset `{args.preset}`, {fixed.STEPS} steps (the first excluded). Mean step throughput in tok/s. "
          f"Paper: PEARL over RLBoost+ +5.3% to +63.7% across batch 32-128, +9.8% to +26.5% across 8K-32K.\n\n"
          + md_table(["batch", "max trajectory tokens", "RLBoost+", "PEARL", "PEARL / RLBoost+",
                      "PEARL's topologies", "busiest / mean busy (RLBoost+ / PEARL)",
                      "rollout / latency floor (RLBoost+ / PEARL)"], rows))
    write(name, {"preset": args.preset, "steps": fixed.STEPS, "settings": settings, "cells": cells}, md)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    grouped_bars(ax, [f"B{b}\n{n // 1024}K" for b, n in settings],
                 {LABELS[s]: [tput[(b, n, s)] for b, n in settings] for s in SYSTEMS},
                 ylabel="step throughput (tok/s)", colors={LABELS[s]: COLORS[s] for s in SYSTEMS})
    save(fig, RESULTS / name / "sensitivity.png")
    return 0
