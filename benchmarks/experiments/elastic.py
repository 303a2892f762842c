"""Elastic trace replay (the paper's Figures 5 and 6): three two-hour segments of the
Bamboo p3 trace, both model profiles, ROLL, ROLL-Large, RLBoost+ and PEARL.

Throughput of a step = (rollout generated + training tokens) / step duration; a run's
number is the mean over its in-window steps after the cold first step, normalized to
ROLL's on the same segment and model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmarks.experiments.report import COLORS, SYSTEM_LABELS, md_table, pyplot, roles_panel, step_series, write
from benchmarks.experiments.floor import over_floor
from benchmarks.experiments.runner import (
    RESULTS,
    Job,
    add_profile_fit,
    arg_parser,
    results_name,
    run_jobs,
    with_profile_fit,
)
from benchmarks.harness.replay import ReplayConfig
from benchmarks.harness.systems import SEGMENTS
from pearl_sglang.workload.presets import DEFAULT_PRESET

NAME = "elastic"
SYSTEMS = ("roll", "roll-large", "rlboost", "pearl")
MODELS = ("qwen3-8b", "qwen3-30b-a3b")
PAPER_SPEEDUP = ("PEARL over RLBoost+ +5.8% to +26.9% (Qwen3-8B) and +7.4% to +36.3% (Qwen3-30B-A3B); "
                 "over ROLL 2.17-2.37x and 2.43-2.79x (section 6.2, Figure 5)")


@dataclass(frozen=True)
class Plan:
    models: tuple[str, ...] = MODELS
    segments: tuple[int, ...] = tuple(SEGMENTS)
    minutes: float = 120.0
    batch_size: int = 64
    preset: str = DEFAULT_PRESET    # workload and profiles (the rewrite share is the preset's)


QUICK = Plan(models=("qwen3-8b",), segments=(1,), minutes=30.0, batch_size=32)


def run_name(model: str, segment: int, sys: str) -> str:
    """ROLL's pool is fixed and ignores the trace, so one run per model serves every
    segment (ROLL-Large's size depends on the segment)."""
    return f"{model}-roll" if sys == "roll" else f"{model}-seg{segment}-{sys}"


def jobs(plan: Plan) -> list[Job]:
    by_name = {run_name(m, seg, sys): ReplayConfig(
        system=sys, model=m, segment=plan.segments[0] if sys == "roll" else seg, minutes=plan.minutes,
        batch_size=plan.batch_size, preset=plan.preset)
        for m in plan.models for seg in plan.segments for sys in SYSTEMS}
    return [Job(name, config) for name, config in by_name.items()]


def summarize(plan: Plan, results: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    rows, summary = [], {"plan": plan.__dict__, "cells": []}
    for m in plan.models:
        for seg in plan.segments:
            runs = {sys: results[run_name(m, seg, sys)] for sys in SYSTEMS}
            base = runs["roll"]["summary"]["mean_throughput_tok_s"]
            cell = {"model": m, "segment": seg,
                    "mean_preemptible_workers": runs["pearl"]["trace"]["mean_preemptible_workers"]}
            for sys, r in runs.items():
                s = r["summary"]
                cell[sys] = {"tok_s": s["mean_throughput_tok_s"], "vs_roll": s["mean_throughput_tok_s"] / base,
                             "steps": s["measured_steps"], "errors": s["errors"]}
            cell["pearl_vs_rlboost"] = cell["pearl"]["tok_s"] / cell["rlboost"]["tok_s"]
            cell["rollout_over_floor"] = {sys: over_floor(r) for sys, r in runs.items()}
            cell["busy_busiest_over_mean_max"] = {sys: r["summary"]["busy_busiest_over_mean_max"]
                                                  for sys, r in runs.items()}
            cell["pearl_topologies"] = sorted({s["topology"] for s in runs["pearl"]["steps"]})
            cell["pearl_borrowed_steps"] = sum(bool(s["borrowing"]) for s in runs["pearl"]["steps"])
            # A wrong join or leave answer fails its replay, so every run here had none.
            cell["trace_answers_checked"] = {sys: _checked(r) for sys, r in runs.items()}
            summary["cells"].append(cell)
            rows.append([m, seg, f"{cell['mean_preemptible_workers']:.2f}"]
                        + [f"{cell[sys]['tok_s']:.0f} ({cell[sys]['vs_roll']:.2f}x)" for sys in SYSTEMS]
                        + [f"{cell['pearl_vs_rlboost']:.2f}x", sum(cell[s]["errors"] for s in SYSTEMS)])
    def busy(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"
    floor_rows = [[c["model"], c["segment"]] + [f"{c['rollout_over_floor'][sys]:.2f}; "
                                                + busy(c["busy_busiest_over_mean_max"][sys]) for sys in SYSTEMS]
                  for c in summary["cells"]]
    md_floor = ("\nPer system: rollout time of a step over its latency floor (the slowest trajectory alone on an "
                "idle worker: its environment time, its uncached prefill and its tokens at batch 1; `floor.py`), "
                "mean over the measured steps, 1.00 meaning no allocation of GPUs could have finished the step "
                "sooner; then the worst step's busiest worker's busy time over the pool's mean (1.00: evenly "
                "loaded).\n\n"
                + md_table(["model", "segment"] + [SYSTEM_LABELS[s] for s in SYSTEMS], floor_rows))
    checked = sum(n for c in summary["cells"] for n in c["trace_answers_checked"].values())
    md_floor += (f"\n\nTrace join and leave answers checked against the cluster's table: {checked} "
                 "(RLBoost+ and PEARL follow the trace), none wrong (a wrong one fails its replay).\n")
    md = (f"# Elastic replay (Figures 5 and 6)\n\nWindows of {plan.minutes:g} min, batch {plan.batch_size}, "
          f"preset `{plan.preset}`. Mean step throughput in tok/s "
          f"(ratio to ROLL). Paper: {PAPER_SPEEDUP}.\n\n"
          + md_table(["model", "segment", "mean preemptible workers"] + [SYSTEM_LABELS[s] for s in SYSTEMS]
                     + ["PEARL / RLBoost+", "request errors"], rows) + md_floor)
    return summary, md


def _checked(result: dict[str, Any]) -> int:
    answers = result["trace"].get("answers") or {}
    return answers.get("joins", 0) + answers.get("leaves", 0)


def plot(name: str, plan: Plan, results: dict[str, dict[str, Any]]) -> None:
    plt = pyplot()
    out = RESULTS / name
    for m in plan.models:
        for seg in plan.segments:
            runs = {sys: results[run_name(m, seg, sys)] for sys in SYSTEMS}
            fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, height_ratios=[3, 2])
            for sys, r in runs.items():
                xs, ys = step_series(r)
                ax.plot(xs, ys, color=COLORS[sys], label=SYSTEM_LABELS[sys], lw=1.4)
            for s in runs["pearl"]["steps"]:
                if s["borrowing"]:
                    ax.axvspan(s["start_s"] / 60, s["end_s"] / 60, color="#d62728", alpha=0.06, lw=0)
            tr = ax.twinx()
            targets = runs["pearl"]["trace"]["targets"]
            if targets:
                tr.step([t["t_s"] / 60 for t in targets], [t["workers"] for t in targets], where="post",
                        color="black", alpha=0.35, lw=1, ls="--")
            tr.set_ylabel("preemptible workers (trace, dashed)", fontsize=8)
            ax.set_ylabel("step throughput (tok/s)")
            ax.set_title(f"{m}, segment {seg}: per-step throughput (shaded: PEARL borrowing training GPUs)",
                         fontsize=9)
            ax.legend(fontsize=7, loc="lower left")
            roles_panel(ax2, runs["pearl"], title="PEARL's active workers by role")
            ax2.set_xlabel("minutes")
            fig.tight_layout()
            fig.savefig(out / f"{m}-seg{seg}.png", dpi=110)
            plt.close(fig)
    fig, axes = plt.subplots(1, len(plan.models), figsize=(5 * len(plan.models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], plan.models):
        width = 0.2
        for i, sys in enumerate(SYSTEMS):
            vals = [results[run_name(m, seg, sys)]["summary"]["mean_throughput_tok_s"]
                    / results[run_name(m, seg, "roll")]["summary"]["mean_throughput_tok_s"] for seg in plan.segments]
            ax.bar([j + (i - 1.5) * width for j in range(len(plan.segments))], vals, width,
                   color=COLORS[sys], label=SYSTEM_LABELS[sys])
        ax.set_xticks(range(len(plan.segments)), [f"segment {s}" for s in plan.segments])
        ax.set_ylabel("throughput / ROLL")
        ax.set_title(m, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "normalized.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None, *, quick: bool | None = None) -> int:
    parser = arg_parser("elastic", __doc__)
    parser.add_argument("--models", nargs="+", default=None, choices=MODELS)
    parser.add_argument("--segments", nargs="+", type=int, default=None, choices=sorted(SEGMENTS))
    add_profile_fit(parser)
    args = parser.parse_args(argv)
    is_quick = bool(args.quick or quick)
    plan = Plan(**{**(QUICK if is_quick else Plan()).__dict__, "preset": args.preset})
    if args.models:
        plan = Plan(**{**plan.__dict__, "models": tuple(args.models)})
    if args.segments:
        plan = Plan(**{**plan.__dict__, "segments": tuple(args.segments)})
    name, todo = with_profile_fit(results_name(NAME, quick=is_quick, preset=args.preset), jobs(plan),
                                  args.profile_fit)
    results = run_jobs(name, todo, parallel=args.parallel)
    summary, md = summarize(plan, results)
    write(name, summary, md)
    plot(name, plan, results)
    return 0
