"""Ablation (the paper's Figure 7): 16 training GPUs and 4 to 16 reserved rollout GPUs,
no preemptible GPUs, PEARL's components added one by one; step throughput
((generated + training tokens) / step time) over the steps after the first."""
from __future__ import annotations


from benchmarks.experiments import fixed
from benchmarks.experiments.report import grouped_bars, md_table, pyplot, save, write
from benchmarks.experiments.floor import UTILIZATION_HEADERS, utilization_cells
from benchmarks.experiments.runner import RESULTS, arg_parser, results_name, run_jobs

NAME = "ablation"
SIZES = (4, 8, 16)
# (label, system, pd_mode): the first four add one component each; forced PD is the
# counterfactual "always disaggregate at the best ratio".
VARIANTS = (
    ("colocated (ROLL-like)", "pearl-no-borrow", "colocated"),
    ("forced PD, best ratio", "pearl-no-borrow", "disaggregated"),
    ("+ adaptive PD", "pearl-no-borrow", "auto"),
    ("+ borrowing, ungated", "pearl-ungated", "auto"),
    ("+ gate (PEARL)", "pearl", "auto"),
)


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser("ablation", __doc__)
    args = parser.parse_args(argv)
    sizes, batch = ((4,), 32) if args.quick else (SIZES, 64)
    name = results_name(NAME, quick=args.quick, preset=args.preset)
    grid = {(g, label): fixed.job(gpus=g, pd_mode=mode, batch=batch, system=system, preset=args.preset)
            for g in sizes for label, system, mode in VARIANTS}
    results = run_jobs(name, list(grid.values()), parallel=args.parallel,
                       cache_dir=fixed.cache(args.quick, args.preset))
    tput = {k: results[j.name]["summary"]["mean_throughput_tok_s"] for k, j in grid.items()}
    base_label = VARIANTS[0][0]
    rows, cells = [], []
    for label, _, _ in VARIANTS:
        rows.append([label] + [f"{tput[(g, label)]:.0f} ({tput[(g, label)] / tput[(g, base_label)]:.2f}x; "
                               + "; ".join(utilization_cells(results[grid[(g, label)].name])) + ")"
                               for g in sizes])
        for g in sizes:
            r = results[grid[(g, label)].name]
            cells.append({"gpus": g, "variant": label, "tok_s": tput[(g, label)],
                          "vs_colocated": tput[(g, label)] / tput[(g, base_label)],
                          "topologies": sorted({s["topology"] for s in r["steps"]}),
                          "borrowed_steps": sum(bool(s["borrowing"]) for s in r["steps"])})
    md = (f"# Ablation (Figure 7)\n\n16 training GPUs (8 TP2 overlap workers), Qwen3-8B profile, batch {batch}, "
          f"preset `{args.preset}`, {fixed.STEPS} steps (the first excluded). Mean step throughput in tok/s "
          f"(ratio to colocated; {UTILIZATION_HEADERS[0]}; {UTILIZATION_HEADERS[1]}). Paper: each component adds throughput, borrowing most where reserved GPUs "
          f"are few, and the gate avoids borrowing that does not pay.\n\n"
          + md_table(["variant"] + [f"{g} reserved GPUs" for g in sizes], rows))
    write(name, {"preset": args.preset, "sizes": sizes, "steps": fixed.STEPS, "batch": batch, "cells": cells}, md)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    grouped_bars(ax, [f"{g} GPUs" for g in sizes],
                 {label: [tput[(g, label)] / tput[(g, base_label)] for g in sizes] for label, _, _ in VARIANTS},
                 ylabel="step throughput / colocated")
    save(fig, RESULTS / name / "ablation.png")
    return 0
