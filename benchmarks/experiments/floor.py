"""The latency floor of a rollout step: how long its slowest trajectory would take alone
on an idle worker (every turn's environment latency, its prefill of what the prefix
cache cannot serve, and its tokens decoded at batch 1).

No GPU allocation can finish a step sooner, so a system's step time over this floor is
the part that more GPUs, PD disaggregation or borrowing can still shorten.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from benchmarks.harness.replay import ReplayConfig
from pearl_sglang.emulator.profile import CostModel, load_profile
from pearl_sglang.workload.swe import SweSampler, SweWorkload


def trajectory_floor_s(sampler: SweSampler, index: int, cost: CostModel, *,
                       chunk: int = 8192) -> tuple[float, float]:
    """(seconds alone on an idle worker, of which environment) for trajectory ``index``.

    Each turn after the first prefills what its own worker's cache would miss: the
    rewritten tail plus the previous response and observation (in chunks of ``chunk``
    tokens, each paying the prefill iteration's fixed cost). The first prompt is left out:
    a member of its GRPO group may have cached it, and a floor must not overestimate."""
    ctx, total, env = len(sampler.initial_prompt(index)), 0.0, 0.0
    start = ctx
    per_token = cost.decode_s(1, 0)  # batch-1 iteration without its context term
    for k in range(sampler.turn_count(index)):
        plan = sampler.turn(index, k)
        if not sampler.fits(ctx, plan):
            break
        for at in range(start, ctx, chunk):
            total += cost.prefill_fixed_s + cost.prefill_tokens_s(min(chunk, ctx - at), at)
        n = plan.response_tokens
        total += n * per_token + cost.decode_per_ctx_token_s * (n * ctx + n * (n - 1) / 2) + plan.env_latency_s
        env += plan.env_latency_s
        start = ctx - sampler.rewritten_tokens(ctx)
        ctx += n + len(plan.observation_ids)
    return total, env


def step_floors(workload: SweWorkload, emulator_profile: str, steps: range) -> list[dict[str, float]]:
    """Per step: the floor and the environment share of its slowest trajectory."""
    sampler, cost = SweSampler(workload), load_profile(emulator_profile).cost
    out = []
    for step in steps:
        slowest = max(trajectory_floor_s(sampler, step * workload.batch_size + i, cost)
                      for i in range(workload.batch_size))
        out.append({"step": step, "floor_s": slowest[0], "env_s": slowest[1]})
    return out


def mean_alone_s(workload: SweWorkload, emulator_profile: str, steps: range) -> float:
    """Mean time of a trajectory alone on an idle worker: the paper's "unlimited rollout
    GPUs" estimate (one trajectory per data-parallel worker, section 3.1)."""
    sampler, cost = SweSampler(workload), load_profile(emulator_profile).cost
    times = [trajectory_floor_s(sampler, step * workload.batch_size + i, cost)[0]
             for step in steps for i in range(workload.batch_size)]
    return sum(times) / len(times)


def replay_config(result: dict[str, Any]) -> ReplayConfig:
    """The ``ReplayConfig`` a result was run with (its JSON adds resolved fields)."""
    names = {f.name for f in fields(ReplayConfig)}
    return ReplayConfig(**{k: v for k, v in result["config"].items() if k in names})


def over_floor(result: dict[str, Any]) -> float:
    """Mean of (rollout seconds / latency floor) over a replay's measured steps."""
    config = replay_config(result)
    floors = step_floors(config.sweworkload(), config.emulator_profile(), range(len(result["steps"])))
    steps = [s for s in result["steps"][1:] if s["in_window"]] or result["steps"][1:] or result["steps"]
    return sum(s["rollout_s"] / floors[s["step"]]["floor_s"] for s in steps) / len(steps)


UTILIZATION_HEADERS = ("busiest / mean busy", "rollout / floor")


def utilization_cells(result: dict[str, Any]) -> list[str]:
    """The two columns every experiment table carries: the worst step's busiest worker's
    busy time over the pool's mean (1.00: evenly loaded; the router's per-worker
    recording), and the rollout time over the latency floor (``over_floor``)."""
    busy = result["summary"].get("busy_busiest_over_mean_max")
    return ["-" if busy is None else f"{busy:.2f}", f"{over_floor(result):.2f}"]
