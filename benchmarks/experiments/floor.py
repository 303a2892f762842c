"""The latency floor of a rollout step: how long its slowest trajectory would take alone
on an idle worker (every turn's environment latency plus its tokens decoded at batch 1).

No GPU allocation can finish a step sooner, so a system's step time over this floor is
the part that more GPUs, PD disaggregation or borrowing can still shorten.
"""
from __future__ import annotations

from typing import Any

from benchmarks.harness.systems import model
from pearl_sglang.emulator.profile import CostModel, load_profile
from pearl_sglang.workload.swe import SweSampler, SweWorkload


def trajectory_floor_s(sampler: SweSampler, index: int, cost: CostModel) -> tuple[float, float]:
    """(seconds alone on an idle worker, of which environment) for trajectory ``index``."""
    ctx, total, env = len(sampler.initial_prompt(index)), 0.0, 0.0
    per_token = cost.decode_s(1, 0)  # batch-1 iteration without its context term
    for k in range(sampler.turn_count(index)):
        plan = sampler.turn(index, k)
        if not sampler.fits(ctx, plan):
            break
        n = plan.response_tokens
        total += n * per_token + cost.decode_per_ctx_token_s * (n * ctx + n * (n - 1) / 2) + plan.env_latency_s
        env += plan.env_latency_s
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


def over_floor(result: dict[str, Any]) -> float:
    """Mean of (rollout seconds / latency floor) over a replay's measured steps."""
    c = result["config"]
    workload = SweWorkload(batch_size=c["batch_size"], group_size=c["group_size"], seed=c["seed"],
                           rewrite_fraction=c["rewrite_fraction"], **c["workload"])
    floors = step_floors(workload, model(c["model"]).emulator_profile, range(len(result["steps"])))
    steps = [s for s in result["steps"][1:] if s["in_window"]] or result["steps"][1:]
    return sum(s["rollout_s"] / floors[s["step"]]["floor_s"] for s in steps) / len(steps)
