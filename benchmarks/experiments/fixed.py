"""Runs on a fixed set of reserved GPUs with no preemptible ones: the PD sweep, ratio
selection, the ablation and the sensitivity study. Their runs share one cache (``results/fixed/runs``), so a
configuration measured by one experiment is not run again by another."""
from __future__ import annotations

from typing import Any

from benchmarks.experiments.runner import Job, results_name
from benchmarks.harness.replay import ReplayConfig
from pearl_sglang.workload.presets import DEFAULT_PRESET

CACHE = "fixed"
# A warm-up step (cold caches, workers starting) and one measured step. Every fixed
# experiment uses the same count, so the runs they have in common are run once.
STEPS = 2
# The LLM a job runs unless it names another (job names leave it out).
DEFAULT_MODEL = "qwen3-8b"


def cache(quick: bool, preset: str = DEFAULT_PRESET) -> str:
    """The shared run cache; quick runs keep their own (not committed: a fresh clone
    measures them afresh), and so does each preset other than the default."""
    return results_name(CACHE, quick=quick, preset=preset)


def mode_label(pd_mode: str, gpus: int) -> str:
    """``colocated`` -> ``8C``; ``3:5`` -> ``3P5D`` (TP2 workers)."""
    if pd_mode == "colocated":
        return f"{gpus // 2}C"
    if ":" in pd_mode:
        p, d = pd_mode.split(":")
        return f"{p}P{d}D"
    return pd_mode


def splits(workers: int) -> list[str]:
    """Colocated and every P:D split of ``workers``."""
    return ["colocated"] + [f"{p}:{workers - p}" for p in range(1, workers)]


def job(*, gpus: int, pd_mode: str, batch: int, steps: int = STEPS, system: str = "pearl-no-borrow",
        preset: str = DEFAULT_PRESET, rewrite: float | None = None, max_len: int = 32768,
        model: str = DEFAULT_MODEL) -> Job:
    """``gpus`` reserved rollout GPUs, no preemptible ones; the system decides borrowing.
    The workload and profiles are the preset's (``rewrite`` overrides its rewrite share)."""
    name = f"{system}-g{gpus}-{pd_mode.replace(':', 'to')}-b{batch}-s{steps}"
    name += f"-r{rewrite:g}" if rewrite is not None else ""
    name += f"-len{max_len}" if max_len != 32768 else ""
    name += f"-{model}" if model != DEFAULT_MODEL else ""
    config = ReplayConfig(system=system, model=model, dedicated_gpus=gpus, follow_trace=False, pd_mode=pd_mode,
                          batch_size=batch, steps=steps, preset=preset, rewrite_fraction=rewrite, segment=1,
                          workload={"max_trajectory_tokens": max_len} if max_len != 32768 else {})
    return Job(name, config)


def rollout_tok_s(result: dict[str, Any]) -> float:
    return result["summary"]["rollout_throughput_tok_s"]


def final_topology(result: dict[str, Any]) -> str:
    return result["steps"][-1]["topology"] if result["steps"] else "?"
