"""One agentic trajectory: generate, act, observe, repeat (section 2.1, Figure 1b).

Turns are strictly sequential within a trajectory (the next prompt needs this response
and the environment's answer), which is why rollout time is set by the longest
trajectories and why environment steps leave GPU bubbles.  A trajectory ends when the
agent's sampled turn count is reached, when the next turn would not fit in
``max_trajectory_tokens``, or when a turn fails after its retries (kept, marked failed,
so the batch still completes instead of hanging).

A trajectory can be stopped and resumed (partial-rollout carry-over): after every
completed turn (response and environment step) it reports a ``PartialTrajectory``; a
stopped trajectory resumes from the last one, so the turn it was in is generated again
from the same context (by whatever policy serves then) and no completed turn is lost or
repeated.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from pearl_sglang.workload.client import GenerateClient
from pearl_sglang.workload.environment import EmulatedEnvironment
from pearl_sglang.workload.errors import GenerateFailed
from pearl_sglang.workload.results import Trajectory, TurnTelemetry
from pearl_sglang.workload.swe import SweSampler, TurnPlan


@dataclass(frozen=True)
class TrajectoryContext:
    """The collaborators every trajectory of a run shares. ``policy_version`` reads the
    version the trainer pushed last (recorded with each turn); ``turns_hint`` what the
    client tells the router to expect of a trajectory's turns (by index; None: nothing)."""

    sampler: SweSampler
    environment: EmulatedEnvironment
    client: GenerateClient
    policy_version: Callable[[], str] = lambda: ""
    turns_hint: Callable[[int], Optional[int]] = lambda index: None


@dataclass(frozen=True)
class PartialTrajectory:
    """A trajectory between two turns: everything needed to go on from ``next_turn``."""

    index: int
    trajectory_id: str
    started_step: int
    start: float
    context: np.ndarray
    plan: TurnPlan
    next_turn: int
    generated: int = 0
    errors: tuple[str, ...] = ()
    telemetry: tuple[TurnTelemetry, ...] = ()

    @classmethod
    def fresh(cls, sampler: SweSampler, *, index: int, step: int, trajectory_id: str,
              start: float) -> "PartialTrajectory":
        return cls(index=index, trajectory_id=trajectory_id, started_step=step, start=start,
                   context=np.asarray(sampler.initial_prompt(index), dtype=np.int64),
                   plan=sampler.turn(index, 0), next_turn=0)


async def run_trajectory(ctx: TrajectoryContext, *, index: int, step: int, trajectory_id: str,
                         resume: Optional[PartialTrajectory] = None,
                         on_turn: Callable[[PartialTrajectory], None] = lambda p: None) -> Trajectory:
    """Run (or, with ``resume``, go on with) one trajectory in rollout ``step``;
    ``on_turn`` gets its state after each completed turn."""
    sampler, time = ctx.sampler, ctx.environment.time
    state = resume or PartialTrajectory.fresh(sampler, index=index, step=step, trajectory_id=trajectory_id,
                                              start=time.now())
    context, plan = state.context, state.plan
    wanted = sampler.turn_count(index)
    expected = ctx.turns_hint(index)
    telemetry: list[TurnTelemetry] = list(state.telemetry)
    errors: list[str] = list(state.errors)
    generated = state.generated
    failed = False
    for turn in range(state.next_turn, wanted):
        version = ctx.policy_version()
        try:
            gen = await ctx.client.generate(context, max_new_tokens=plan.response_tokens,
                                            trajectory_id=trajectory_id, turn=turn, expected_turns=expected)
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
            request_s=gen.request_s, attempts=gen.attempts, policy_version=version,
            weight_version=gen.weight_version))
        if turn + 1 < wanted:
            following = sampler.turn(index, turn + 1)
            nxt = sampler.next_context_array(context, gen.output_ids, plan, index)
            if sampler.fits(len(nxt), following):
                context, plan = nxt, following
                on_turn(replace(state, context=context, plan=plan, next_turn=turn + 1, generated=generated,
                                errors=tuple(errors), telemetry=tuple(telemetry)))
                continue
        # the trained sequence ends with the last response
        context = np.concatenate([context, np.asarray(gen.output_ids, dtype=np.int64)])
        break
    return Trajectory(index=index, trajectory_id=trajectory_id, group=sampler.group_of(index),
                      step=step, tokens=len(context), generated_tokens=generated,
                      turns=len(telemetry), start=state.start, end=time.now(), errors=tuple(errors),
                      failed=failed, telemetry=tuple(telemetry),
                      started_step=state.started_step if resume is not None else None)
