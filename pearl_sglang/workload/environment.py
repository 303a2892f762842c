"""The emulated agent environment (the sandbox that runs the agent's action).

A real SWE environment executes the action (edit, run tests) and answers with an
observation after a long-tailed delay.  Here the observation and the delay come from
the workload sampler, and the delay is spent through the injected ``EmulatedTime``, so
the same code waits in real time for a demo and costs nothing under a virtual-time
event loop.  Environment steps never touch the GPUs, which is exactly the bubble that
the paper's theta measures.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl_sglang.workload.swe import SweSampler, TurnPlan
from pearl_sglang.workload.timebase import EmulatedTime


@dataclass(frozen=True)
class Observation:
    token_ids: tuple[int, ...]
    env_time_s: float


class EmulatedEnvironment:
    def __init__(self, sampler: SweSampler, *, time: EmulatedTime | None = None) -> None:
        self.sampler = sampler
        self.time = time or EmulatedTime()
        self.time.validate()

    async def step(self, index: int, plan: TurnPlan) -> Observation:
        """Run turn ``plan.turn_index`` of trajectory ``index``'s action; emulated latency."""
        await self.time.wait(plan.env_latency_s)
        return Observation(token_ids=plan.observation_ids, env_time_s=plan.env_latency_s)
