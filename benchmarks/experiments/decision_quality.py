"""Decision quality: at each point of a grid (regime x reserved GPUs x batch x LLM), run every
candidate configuration (colocated, each P:D split, borrowing on and off) as a fixed
replay, take the empirical best, and compare the engine's own choice under each makespan
model (``paper``: today's engine, the baseline row; ``tail``: the tail-aware model).

The objective is step throughput ((generated + training tokens) / step time) of the
measured step, as in the ablation: borrowing is charged what it costs the step
(activation during rollout, returning the GPUs before training), so a borrow that does
not pay shows as no gain or a loss.  A candidate "with borrowing" borrows the 16 training
GPUs (8 TP2 overlap workers) every step at its pinned topology (the ungated system); one
"without" never borrows.  The engine runs the full PEARL system (adaptive PD, gated
borrowing) with ``makespan_model`` set to the model under test.

``--profile-fit workload`` runs the whole grid with the cluster's ``profile_fit: workload``
(the configured engine rates, the workload's symbols refitted) into
``results/decision-quality-profile-fit-workload/``.

Besides the loss of each choice, the summary reports ``borrow_refused_when_useless``: at
every point where the best borrowing candidate is no better than the best one without
(borrowing gains less than it costs), the engine did not borrow in the measured step.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from benchmarks.experiments import fixed
from benchmarks.experiments.report import md_table, pyplot, save, write
from benchmarks.experiments.runner import (
    RESULTS,
    Job,
    add_profile_fit,
    arg_parser,
    results_name,
    run_jobs,
    with_profile_fit,
)
from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.core.prediction_error import mape_by_model

NAME = "decision-quality"
MODELS = ("paper", "tail")
# Regime -> (preset, workload overrides).  swe-paper is the paper's regime (prefill-heavy:
# 95% of the context re-prefilled per turn); cache-friendly keeps the whole context
# cached; compute-bound cuts the environment latency tenfold, so the pool's throughput
# sets the step; env-bound is the environment-latency-bound preset.
REGIMES: dict[str, tuple[str, dict[str, Any]]] = {
    "swe-paper": ("swe-paper", {}),
    "env-bound": ("env-bound", {}),
    "cache-friendly": ("swe-paper", {"rewrite_fraction": 0.0}),
    "compute-bound": ("swe-paper", {"env_latency_median_s": 0.05, "env_latency_p90_s": 0.5}),
}
class Point(NamedTuple):
    regime: str
    gpus: int     # reserved rollout GPUs (TP2 workers: half as many)
    batch: int
    llm: str = fixed.DEFAULT_MODEL

    @classmethod
    def of(cls, row: dict[str, Any]) -> "Point":
        return cls(row["regime"], row["gpus"], row["batch"], row["llm"])

    def label(self, *, short: bool = False) -> str:
        """``short``: for the plot's axis (regime and LLM abbreviated)."""
        regime, llm = (self.regime[:3], self.llm.removeprefix("qwen3-")) if short else (self.regime, self.llm)
        return f"{regime} g{self.gpus} b{self.batch}{'' if self.llm == fixed.DEFAULT_MODEL else ' ' + llm}"


# Qwen3-8B: 28 points, batch 128 at 8 GPUs in each regime; Qwen3-30B-A3B: 12 points, every
# regime at 4, 8 and 16 GPUs, batch 64. --quick runs QUICK_POINTS (CI-sized).
FULL_POINTS = tuple(Point(r, g, b) for r in REGIMES for g in (4, 8, 16) for b in (32, 64)) + \
    tuple(Point(r, 8, 128) for r in REGIMES) + \
    tuple(Point(r, g, 64, "qwen3-30b-a3b") for r in REGIMES for g in (4, 8, 16))
QUICK_POINTS = tuple(Point(r, g, 32) for r in ("swe-paper", "env-bound") for g in (4, 8))
WITHIN = 0.02


def candidates(gpus: int) -> list[tuple[str, bool]]:
    """(pd_mode, borrow) for every topology of ``gpus // 2`` TP2 workers, both ways."""
    return [(mode, borrow) for mode in fixed.splits(gpus // 2) for borrow in (False, True)]


def _job(point: Point, *, pd_mode: str, system: str) -> Job:
    preset, workload = REGIMES[point.regime]
    j = fixed.job(gpus=point.gpus, pd_mode=pd_mode, batch=point.batch, preset=preset, system=system,
                  model=point.llm)
    return Job(f"{point.regime}-{j.name}", replace(j.config, workload=workload) if workload else j.config)


def candidate_job(point: Point, mode: str, borrow: bool) -> Job:
    return _job(point, pd_mode=mode, system="pearl-ungated" if borrow else "pearl-no-borrow")


def engine_job(point: Point, model: str) -> Job:
    j = _job(point, pd_mode="auto", system="pearl")
    return Job(f"{j.name}-{model}", replace(j.config, cluster_overrides={"makespan_model": model}))


def measured(result: dict[str, Any]) -> dict[str, Any]:
    """The measured step (the last; the first warms up) of a replay."""
    return result["steps"][-1]


def step_tok_s(result: dict[str, Any]) -> float:
    return result["summary"]["mean_throughput_tok_s"]


def balance(result: dict[str, Any]) -> float | None:
    """The worst measured step's busiest worker's busy time over the pool's mean."""
    return result["summary"].get("busy_busiest_over_mean_max")


def _bal(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def jobs_of(points: tuple[Point, ...]) -> dict[tuple, Job]:
    grid: dict[tuple, Job] = {}
    for point in points:
        for mode, borrow in candidates(point.gpus):
            grid[(point, "candidate", mode, borrow)] = candidate_job(point, mode, borrow)
        for model in MODELS:
            grid[(point, "engine", model)] = engine_job(point, model)
    return grid


def evaluate_point(point: Point, grid: dict[tuple, Job],
                   results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The empirical best, each model's choice and its loss at one point."""
    cands = {(mode, borrow): step_tok_s(results[grid[(point, "candidate", mode, borrow)].name])
             for mode, borrow in candidates(point.gpus)}
    best_key = max(cands, key=cands.get)
    best = cands[best_key]
    best_on = max(v for (_, b), v in cands.items() if b)
    best_off = max(v for (_, b), v in cands.items() if not b)
    out: dict[str, Any] = {
        "regime": point.regime, "gpus": point.gpus, "batch": point.batch, "llm": point.llm,
        "best": {"pd_mode": best_key[0], "borrow": best_key[1], "tok_s": best,
                 "busiest_over_mean": balance(results[grid[(point, "candidate", *best_key)].name])},
        "candidates": [{"pd_mode": m, "borrow": b, "tok_s": v} for (m, b), v in cands.items()],
        "borrow_gain": (best_on - best_off) / best_off if best_off > 0 else 0.0,
        "borrowing_useless": best_on <= best_off,
    }
    for model in MODELS:
        r = results[grid[(point, "engine", model)].name]
        step = measured(r)
        pred = step.get("prediction") or {}
        v = step_tok_s(r)
        # The step's own record says whether it borrowed (the row's ``borrowing`` is the
        # state after train_finished, i.e. the next step's).
        borrowed = pred["borrowed"] if pred else step["borrowing"]
        out[model] = {"tok_s": v, "loss": max(0.0, (best - v) / best) if best > 0 else 0.0,
                      "busiest_over_mean": balance(r),
                      "topology": step["topology"], "borrowed": bool(borrowed), "prediction": pred}
    return out


def summarize_model(rows: list[dict[str, Any]], model: str) -> dict[str, Any]:
    losses = [r[model]["loss"] for r in rows]
    useless = [r for r in rows if r["borrowing_useless"]]
    return {
        "points": len(rows),
        "within_2pct": sum(loss <= WITHIN for loss in losses),
        "within_2pct_share": sum(loss <= WITHIN for loss in losses) / len(rows) if rows else None,
        "worst_loss": max(losses, default=0.0),
        "mean_loss": sum(losses) / len(losses) if losses else 0.0,
        "useless_borrow_points": len(useless),
        "borrowed_when_useless": sum(r[model]["borrowed"] for r in useless),
        "borrow_refused_when_useless": all(not r[model]["borrowed"] for r in useless),
    }


def _regime_key(point: Point) -> str:
    return point.regime if point.llm == fixed.DEFAULT_MODEL else f"{point.regime} {point.llm}"


def prediction_errors(points: tuple[Point, ...], grid: dict[tuple, Job],
                      results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per regime (and LLM, for the ones other than the default), each model's MAPE against
    the measured rollout time over the measured steps of every replay of that regime
    (candidates and engines), and the step count."""
    out: dict[str, dict[str, Any]] = {}
    for regime in dict.fromkeys(map(_regime_key, points)):
        records = [p for key, job in grid.items() if _regime_key(key[0]) == regime
                   for s in results[job.name]["steps"][1:] if (p := s.get("prediction"))]
        out[regime] = {"steps": len(records), **mape_by_model(records)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(NAME, __doc__)
    add_profile_fit(parser)
    args = parser.parse_args(argv)
    points = QUICK_POINTS if args.quick else FULL_POINTS
    grid = jobs_of(points)
    # Every replay, candidates included: placement uses the fitted profile too.
    name, todo = with_profile_fit(results_name(NAME, quick=args.quick, preset="swe-paper"),
                                  list(grid.values()), args.profile_fit)
    results = run_jobs(name, todo, parallel=args.parallel)
    rows = [evaluate_point(p, grid, results) for p in points]
    by_model = {m: summarize_model(rows, m) for m in MODELS}
    errors = prediction_errors(points, grid, results)
    chosen = ClusterConfig().makespan_model  # the top-level figures are PEARL's default's
    summary = {"points": len(rows), "grid": [list(p) for p in points], "steps": fixed.STEPS,
               "profile_fit": args.profile_fit,
               **{k: by_model[chosen][k] for k in ("within_2pct", "worst_loss", "mean_loss",
                                                    "borrow_refused_when_useless")},
               "model": chosen, "by_model": by_model, "prediction_mape": errors, "rows": rows}
    table = []
    for r in rows:
        best = r["best"]
        table.append([Point.of(r).label(),
                      f"{fixed.mode_label(best['pd_mode'], r['gpus'])}{' +borrow' if best['borrow'] else ''} "
                      f"{best['tok_s']:.0f}; {_bal(best['busiest_over_mean'])}", f"{r['borrow_gain']:+.1%}"]
                     + [f"{r[m]['topology']}{' +borrow' if r[m]['borrowed'] else ''} {r[m]['tok_s']:.0f} "
                        f"({r[m]['loss']:.1%}; {_bal(r[m]['busiest_over_mean'])})" for m in MODELS])
    totals = [[m, s["points"], f"{s['within_2pct']} ({s['within_2pct_share']:.0%})", f"{s['worst_loss']:.1%}",
               f"{s['mean_loss']:.1%}", f"{s['borrowed_when_useless']}/{s['useless_borrow_points']}",
               s["borrow_refused_when_useless"]] for m, s in by_model.items()]
    md = (f"# Decision quality (profile_fit: {args.profile_fit})\n\nPoints: {len(rows)} (regime, reserved GPUs, "
          f"batch; Qwen3-8B unless another LLM is named); every candidate and each "
          f"engine is a {fixed.STEPS}-step fixed replay (the first step warms up), 16 training GPUs (8 overlap "
          f"workers) available for borrowing. Step throughput in tok/s of the measured step; loss = "
          f"(best - choice) / best; after the semicolon the worst measured step's busiest worker's busy "
          f"time over the pool's mean (1.00: evenly loaded).\n\n"
          + md_table(["point", "empirical best", "best borrow vs no borrow", "paper model (today)",
                      "tail-aware model"], table)
          + "\n" + md_table(["model", "points", "within 2%", "worst loss", "mean loss",
                             "borrowed where useless", "refused useless borrowing"], totals)
          + "\nPrediction error (MAPE of the predicted rollout time against the measured one, measured steps of "
            "every replay of the regime, each for the configuration that ran):\n\n"
          + md_table(["regime", "steps"] + [f"{m} model" for m in MODELS],
                     [[regime, e["steps"]] + [f"{e[m]:.1%}" if e.get(m) is not None else "-" for m in MODELS]
                      for regime, e in errors.items()]))
    write(name, summary, md)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.7), 3.6))
    labels = [Point.of(r).label(short=True) for r in rows]
    width = 0.4
    for i, m in enumerate(MODELS):
        ax.bar([j + (i - 0.5) * width for j in range(len(rows))], [100 * r[m]["loss"] for r in rows], width,
               label=f"{m} model")
    ax.axhline(100 * WITHIN, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), labels, rotation=30, fontsize=7)
    ax.set_ylabel("loss vs empirical best (%)")
    ax.legend(fontsize=7)
    save(fig, RESULTS / name / "decision_quality.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
