"""The paper's measurements of its own regime (section 3, Figure 2a and 2b), replayed.

Figure 2(a): Qwen3-8B, a colocated data-parallel pool of 16, 24 and 32 rollout GPUs (TP2
workers, batch 64 in GRPO groups of 16 split across them), training on 8 GPUs at the
paper's 163.8 s a step. The paper's rollout time falls 10.3% from 16 to 24 GPUs and a
further 8.9% to 32 (both of the 16-GPU time), and rollout is 81.8% of the step at 32.
With unlimited GPUs (one trajectory per worker) its mean trajectory lasts 216.3 s; here
that is each trajectory alone on an idle worker (``floor.mean_alone_s``).

Figure 2(b): Qwen3-30B-A3B colocated on 16 GPUs: prefill does 96.68% of the tokens in
26.48% of the time, and decode runs near 400 tok/s per GPU between prefill insertions.
Here from the emulated engines' phase counters (``emulator.stats``): iterations that
prefill against decode-only ones.

These are the facts ``benchmarks.calibrate`` fits the ``swe-paper`` preset to; the
paper's headline results (sections 6.2-6.4) are not among them.
"""
from __future__ import annotations

from typing import Any, Mapping

from benchmarks.experiments.floor import mean_alone_s, over_floor, replay_config
from benchmarks.experiments.report import md_table, write
from benchmarks.experiments.runner import Job, arg_parser, results_name, run_jobs
from benchmarks.harness.replay import ReplayConfig

NAME = "scaling"
POOLS = (16, 24, 32)           # rollout GPUs (TP2 workers: 8, 12, 16)
TRAIN_8_GPUS_S = 163.8         # the paper's training step on 8 GPUs (section 3.1)
FIG2B_GPUS = 16
PAPER = {
    "reduction_16_to_24": 0.103, "reduction_24_to_32": 0.089, "rollout_share_32": 0.818,
    "mean_trajectory_s": 216.3, "fig2b_prefill_token_share": 0.9668, "fig2b_prefill_time_share": 0.2648,
    "fig2b_decode_tok_s_per_gpu": 400.0,
}
# How a fact counts as reproduced (the bar): points for shares, relative for the rest.
TOLERANCE = {"reduction_16_to_24": 0.03, "reduction_24_to_32": 0.03, "rollout_share_32": 0.05,
             "fig2b_prefill_token_share": 0.03, "fig2b_prefill_time_share": 0.03,
             "mean_trajectory_s": 0.10, "fig2b_decode_tok_s_per_gpu": 0.15}
RELATIVE = ("mean_trajectory_s", "fig2b_decode_tok_s_per_gpu")


def steps(quick: bool) -> int:
    """Full: a warm-up step and a measured one; quick: the first step alone."""
    return 1 if quick else 2


def jobs(*, preset: str, quick: bool, workload: Mapping[str, Any] | None = None,
         profiles: Mapping[str, str] | None = None, tag: str = "") -> dict[str, Job]:
    """The four replays: three 8B pools and the 30B-A3B colocated pool. ``workload`` and
    ``profiles`` (model -> profile JSON path) override the preset's (calibration)."""
    profiles = profiles or {}

    def job(name: str, model: str, gpus: int) -> Job:
        return Job(f"{name}{tag}", ReplayConfig(
            system="roll", model=model, dedicated_gpus=gpus, follow_trace=False, pd_mode="colocated",
            batch_size=64, group_size=16, steps=steps(quick), preset=preset, workload=dict(workload or {}),
            emulator_profile_path=profiles.get(model), train_step_s=TRAIN_8_GPUS_S, segment=1))
    out = {f"8b-g{g}": job(f"qwen3-8b-g{g}", "qwen3-8b", g) for g in POOLS}
    out["fig2b"] = job(f"qwen3-30b-a3b-g{FIG2B_GPUS}", "qwen3-30b-a3b", FIG2B_GPUS)
    return out


def _measured(result: dict[str, Any]) -> list[dict[str, Any]]:
    return result["steps"][1:] or result["steps"]


def rollout_s(result: dict[str, Any]) -> float:
    m = _measured(result)
    return sum(s["rollout_s"] for s in m) / len(m)


def phases(result: dict[str, Any]) -> dict[str, float]:
    """Figure 2(b)'s three numbers from the workers' phase counters (the whole run)."""
    e = result["engines"]
    prefill, generated = sum(w["prefill_tokens"] for w in e), sum(w["generated_tokens"] for w in e)
    t_prefill, t_decode = sum(w["prefill_iteration_s"] for w in e), sum(w["decode_only_s"] for w in e)
    decode_gpu_s = sum(w["decode_only_s"] * w["tp_size"] for w in e)
    return {"fig2b_prefill_token_share": prefill / max(prefill + generated, 1),
            "fig2b_prefill_time_share": t_prefill / max(t_prefill + t_decode, 1e-9),
            "fig2b_decode_tok_s_per_gpu": sum(w["decode_only_tokens"] for w in e) / max(decode_gpu_s, 1e-9)}


def facts(results: dict[str, dict[str, Any]], named: dict[str, Job]) -> dict[str, Any]:
    """The summary's measured facts (keys of ``PAPER``) plus what explains them."""
    by_pool = {g: results[named[f"8b-g{g}"].name] for g in POOLS}
    t = {g: rollout_s(r) for g, r in by_pool.items()}
    first = replay_config(by_pool[POOLS[0]])
    measured_steps = range(len(by_pool[POOLS[0]]["steps"]))
    balance = [r["summary"]["busy_busiest_over_mean_max"] for r in by_pool.values()]
    out = {
        "reduction_16_to_24": (t[16] - t[24]) / t[16],
        "reduction_24_to_32": (t[24] - t[32]) / t[16],
        "rollout_share_32": t[32] / (t[32] + TRAIN_8_GPUS_S),
        "mean_trajectory_s": mean_alone_s(first.sweworkload(), first.emulator_profile(), measured_steps),
        "max_busy_over_mean": max((b for b in balance if b is not None), default=None),
        **phases(results[named["fig2b"].name]),
        "rollout_s": {str(g): v for g, v in t.items()},
        "rollout_over_floor": {str(g): over_floor(r) for g, r in by_pool.items()},
        "busy_over_mean": {str(g): b for g, b in zip(POOLS, balance)},
        "errors": sum(r["summary"]["errors"] for r in results.values()),
    }
    # T(n) = F + C/n through 16 and 32 GPUs: the GPU-independent part and the GPU-seconds.
    c = (t[16] - t[32]) / (1 / 16 - 1 / 32)
    out["fit_F_s"], out["fit_C_gpu_s"] = t[32] - c / 32, c
    return out


def misses(measured: Mapping[str, Any]) -> dict[str, float]:
    """Per fact: how far the measurement is from the paper, in the fact's own unit of
    tolerance (points, or a share of the paper's value); |x| <= 1 is within the bar."""
    out = {}
    for key, paper in PAPER.items():
        gap = measured[key] - paper
        out[key] = (gap / paper if key in RELATIVE else gap) / TOLERANCE[key]
    return out


def fact_table(measured: Mapping[str, Any]) -> str:
    rows, miss = [], misses(measured)
    for key, paper in PAPER.items():
        v, m = measured[key], miss[key]
        fmt = (lambda x: f"{x:.1f}") if key in RELATIVE else (lambda x: f"{100 * x:.2f}%")
        bar = f"±{100 * TOLERANCE[key]:.0f}%" if key in RELATIVE else f"±{100 * TOLERANCE[key]:.0f} pt"
        rows.append([key, fmt(paper), fmt(v), bar, "yes" if abs(m) <= 1 else f"no ({m:+.1f}x the bar)"])
    return md_table(["fact", "paper", "emulated", "bar", "within"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(NAME, __doc__)
    args = parser.parse_args(argv)
    name = results_name(NAME, quick=args.quick, preset=args.preset)
    named = jobs(preset=args.preset, quick=args.quick)
    results = run_jobs(name, list(named.values()), parallel=args.parallel)
    measured = facts(results, named)
    summary = {"preset": args.preset, "steps": steps(args.quick), **measured,
               "paper": PAPER, "tolerance": TOLERANCE, "misses": misses(measured)}
    pools = [[g, g // 2, f"{measured['rollout_s'][str(g)]:.0f}", f"{measured['rollout_over_floor'][str(g)]:.2f}",
              f"{measured['busy_over_mean'][str(g)] or 0:.2f}"] for g in POOLS]
    md = (f"# Scaling and colocation (Figure 2a, 2b)\n\nPreset `{args.preset}`, {steps(args.quick)} step(s) "
          f"({'the first measured' if args.quick else 'the first excluded'}). Qwen3-8B colocated DP pools, "
          f"batch 64 in groups of 16, training {TRAIN_8_GPUS_S} s (8 GPUs); Figure 2(b) from Qwen3-30B-A3B "
          f"colocated on {FIG2B_GPUS} GPUs.\n\n" + fact_table(measured)
          + f"\nRollout time per pool (T(n) = F + C/n through 16 and 32 GPUs: F = {measured['fit_F_s']:.0f} s, "
            f"C = {measured['fit_C_gpu_s']:.0f} GPU-s; the paper's points give F ~500-630 s, "
            f"C ~4,500-7,800 GPU-s). Request errors: {measured['errors']}.\n\n"
          + md_table(["rollout GPUs", "workers", "rollout s", "rollout / floor", "busiest / mean busy"], pools))
    write(name, summary, md)
    return 0
