"""Ratio selection (the paper's Table 2): at each constant resource point, the decision
engine's choice (PEARL with ``pd_mode: auto``, no borrowing, no preemptible GPUs) next to
the empirically best configuration, found by running colocation and every P:D split."""
from __future__ import annotations


from benchmarks.experiments import fixed
from benchmarks.experiments.report import md_table, write
from benchmarks.experiments.floor import UTILIZATION_HEADERS, utilization_cells
from benchmarks.experiments.runner import arg_parser, results_name, run_jobs

NAME = "ratio"
POINTS = (4, 6, 8, 10, 12, 16)   # reserved GPUs (TP2 workers: 2 to 8)
TOLERANCE = 0.02


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser("ratio", __doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    points = (4, 6) if args.quick else POINTS
    name = results_name(NAME, quick=args.quick, preset=args.preset)
    batch = 32 if args.quick else args.batch_size
    grid = {(g, m): fixed.job(gpus=g, pd_mode=m, batch=batch, preset=args.preset)
            for g in points for m in fixed.splits(g // 2)}
    auto = {g: fixed.job(gpus=g, pd_mode="auto", batch=batch, preset=args.preset) for g in points}
    results = run_jobs(name, [*grid.values(), *auto.values()], parallel=args.parallel,
                       cache_dir=fixed.cache(args.quick, args.preset))
    rows, cells, within = [], [], 0
    for g in points:
        measured = {m: fixed.rollout_tok_s(results[grid[(g, m)].name]) for m in fixed.splits(g // 2)}
        best_mode = max(measured, key=measured.get)
        chosen = results[auto[g].name]
        chosen_tok_s = fixed.rollout_tok_s(chosen)
        loss = 1 - chosen_tok_s / measured[best_mode]
        within += loss <= TOLERANCE
        cells.append({"gpus": g, "chosen": fixed.final_topology(chosen), "chosen_tok_s": chosen_tok_s,
                      "best": fixed.mode_label(best_mode, g), "best_tok_s": measured[best_mode], "loss": loss,
                      "all": {fixed.mode_label(m, g): v for m, v in measured.items()}})
        rows.append([g, fixed.final_topology(chosen), f"{chosen_tok_s:.0f}", fixed.mode_label(best_mode, g),
                     f"{measured[best_mode]:.0f}", f"{100 * loss:+.1f}%", *utilization_cells(chosen),
                     ", ".join(f"{fixed.mode_label(m, g)} {v:.0f}" for m, v in measured.items())])
    md = (f"# Ratio selection (Table 2)\n\nQwen3-8B profile, preset `{args.preset}`, batch {batch}, "
          f"{fixed.STEPS} steps (the first excluded); rollout throughput in generated tok/s. The choice is within "
          f"{100 * TOLERANCE:.0f}% of the best on **{within} of {len(points)}** resource points "
          f"(paper: the chosen ratio is the best or within a few percent on every point). Utilization columns "
          f"are the engine's choice's run.\n\n"
          + md_table(["GPUs", "engine's choice", "choice tok/s", "best", "best tok/s", "lost", *UTILIZATION_HEADERS,
                      "every configuration"],
                     rows))
    write(name, {"preset": args.preset, "batch": batch, "steps": fixed.STEPS, "tolerance": TOLERANCE, "within": within, "cells": cells}, md)
    return 0
