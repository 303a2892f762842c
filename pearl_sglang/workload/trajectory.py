"""One agentic trajectory: generate, act, observe, repeat (section 2.1, Figure 1b).

Turns are strictly sequential within a trajectory (the next prompt needs this response
and the environment's answer), which is why rollout time is set by the longest
trajectories and why environment steps leave GPU bubbles.  A trajectory ends when the
agent's sampled turn count is reached, when the next turn would not fit in
``max_trajectory_tokens``, or when a turn fails after its retries (kept, marked failed,
so the batch still completes instead of hanging).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pearl_sglang.workload.client import GenerateClient
from pearl_sglang.workload.environment import EmulatedEnvironment
from pearl_sglang.workload.errors import GenerateFailed
from pearl_sglang.workload.results import Trajectory, TurnTelemetry
from pearl_sglang.workload.swe import SweSampler


@dataclass(frozen=True)
class TrajectoryContext:
    """The collaborators every trajectory of a run shares."""

    sampler: SweSampler
    environment: EmulatedEnvironment
    client: GenerateClient


async def run_trajectory(ctx: TrajectoryContext, *, index: int, step: int,
                         trajectory_id: str) -> Trajectory:
    sampler, time = ctx.sampler, ctx.environment.time
    start = time.now()
    context = np.asarray(sampler.initial_prompt(index), dtype=np.int64)
    wanted = sampler.turn_count(index)
    telemetry: list[TurnTelemetry] = []
    errors: list[str] = []
    generated = 0
    failed = False
    plan = sampler.turn(index, 0)
    for turn in range(wanted):
        try:
            gen = await ctx.client.generate(context, max_new_tokens=plan.response_tokens,
                                            trajectory_id=trajectory_id, turn=turn)
        except GenerateFailed as e:
            errors.extend(e.errors)
            failed = True
            break
        errors.extend(gen.errors)
        generated += len(gen.output_ids)
        obs = await ctx.environment.step(index, plan)
        telemetry.append(TurnTelemetry(
            trajectory_id=trajectory_id, step=step, turn_index=turn,
            prompt_tokens=gen.prompt_tokens, cached_tokens=gen.cached_tokens,
            generated_tokens=len(gen.output_ids), env_time_s=obs.env_time_s,
            request_s=gen.request_s, attempts=gen.attempts))
        if turn + 1 < wanted:
            following = sampler.turn(index, turn + 1)
            nxt = sampler.next_context_array(context, gen.output_ids, plan, index)
            if sampler.fits(len(nxt), following):
                context, plan = nxt, following
                continue
        # the trained sequence ends with the last response
        context = np.concatenate([context, np.asarray(gen.output_ids, dtype=np.int64)])
        break
    return Trajectory(index=index, trajectory_id=trajectory_id, group=sampler.group_of(index),
                      step=step, tokens=len(context), generated_tokens=generated,
                      turns=len(telemetry), start=start, end=time.now(), errors=tuple(errors),
                      failed=failed, telemetry=tuple(telemetry))
