"""Asynchronous agentic RL against a router: PEARL's demo job and benchmark workload.

The pipeline is the paper's (sections 2.1, 4.1.2, 6.1) with a policy staleness of one
step: the trainer waits for a complete batch of B trajectories; training k starts once
batch k is complete and step k-1's weights are pushed, and the rollout of step k+1
starts beside it, on weights one update behind, once the router has answered
``train_begin`` (so the router closes step k before any turn of step k+1 arrives).
Rollout k+2 therefore waits for both batch k+1 and the weights of step k, so no
trajectory is ever more than one step stale.  Around every training step
the hooks fire in a fixed order: ``train_begin``, ``train_finished`` (also when the
trainer raises or the run is cancelled), then ``push_weights`` after a good update.

Everything that takes time goes through one ``EmulatedTime`` (environment latency,
training, back-off), and HTTP through one ``aiohttp.ClientSession``.

Partial-rollout carry-over (``DriverConfig.carry_over_share``, off by default): a step's
rollout ends once that share of its batch has finished; the rest are stopped (their
request in flight is cancelled, which makes the router abort it on its workers) and
resumed first in the next step, from their last completed turn, beside enough new
trajectories to fill the batch again. Every trajectory is trained exactly once, in the
step in which it finishes; each turn records the policy version that generated it
(``TurnTelemetry.policy_version``), so a trainer can weight or filter the off-policy
turns of carried trajectories. Trajectories still unfinished when the run ends are
reported in the last step's ``carried_out`` and never trained.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
from dataclasses import dataclass
from statistics import fmean
from typing import Awaitable, Callable, Optional, Sequence

import aiohttp

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.workload.client import FrontDoor, GenerateClient
from pearl_sglang.workload.environment import EmulatedEnvironment
from pearl_sglang.workload.errors import TrainingFailed
from pearl_sglang.workload.results import StepResult, Trajectory
from pearl_sglang.workload.swe import SweSampler, SweWorkload
from pearl_sglang.workload.timebase import EmulatedTime
from pearl_sglang.workload.trainer import EmulatedTrainer, Trainer, TrainerProfile, TrainHooks
from pearl_sglang.workload.trajectory import PartialTrajectory, TrajectoryContext, run_trajectory

log = logging.getLogger(__name__)

OnStep = Callable[[StepResult], Optional[Awaitable[None]]]
_ERROR_SAMPLES = 5


@dataclass(frozen=True)
class DriverConfig:
    """``retry_delays_s`` are emulated seconds (one retry per entry); the request timeout
    is in seconds of the event loop's clock, since it bounds a real HTTP call."""

    steps: Optional[int] = None
    retry_delays_s: tuple[float, ...] = (0.5, 2.0, 8.0)
    request_timeout_s: float = 900.0
    trajectory_prefix: str = "traj"
    max_connections: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    # End each rollout once this share of its batch finished and carry the rest into the
    # next step (None: every step waits for its whole batch).
    carry_over_share: Optional[float] = None
    # Tell the router how many turns each trajectory will take (``X-Pearl-Expected-Turns``),
    # with a lognormal error of this sigma (0: exact; None: no hint), as a framework that
    # knows its tasks' turns from an earlier epoch would.
    turns_hint_sigma: Optional[float] = None

    def validate(self) -> None:
        if self.turns_hint_sigma is not None and not self.turns_hint_sigma >= 0:
            raise InvalidConfig("turns_hint_sigma must be >= 0 (or None: no hint)", key="turns_hint_sigma")
        if self.carry_over_share is not None and not 0 < self.carry_over_share <= 1:
            raise InvalidConfig("carry_over_share must be in (0, 1] (or None: off)", key="carry_over_share")
        if self.steps is not None and self.steps < 1:
            raise InvalidConfig("steps must be >= 1 (or None: until stop())", key="steps")
        if any(d < 0 for d in self.retry_delays_s):
            raise InvalidConfig("retry delays must be >= 0", key="retry_delays_s")
        if not self.request_timeout_s > 0:
            raise InvalidConfig("request_timeout_s must be positive", key="request_timeout_s")
        if self.max_connections < 0:
            raise InvalidConfig("max_connections must be >= 0 (0: unlimited)", key="max_connections")


@dataclass(frozen=True)
class _Batch:
    trajectories: tuple[Trajectory, ...]
    start: float
    end: float
    carried_in: tuple[str, ...] = ()
    carried_out: tuple[PartialTrajectory, ...] = ()


class AgenticRLDriver:
    def __init__(self, router_url: str, *, workload: SweWorkload,
                 trainer_profile: TrainerProfile = TrainerProfile(),
                 config: DriverConfig = DriverConfig(), time: EmulatedTime | None = None,
                 hooks: TrainHooks = TrainHooks(), trainer: Trainer | None = None,
                 on_step: OnStep | None = None, front_door: FrontDoor | None = None) -> None:
        config.validate()
        self.router_url = router_url
        self.front_door = front_door  # the router in this process: turns skip HTTP (client.py)
        self.config = config
        self.time = time or EmulatedTime()
        self.sampler = SweSampler(workload)
        self.environment = EmulatedEnvironment(self.sampler, time=self.time)
        self.trainer = trainer or EmulatedTrainer(trainer_profile, time=self.time)
        self.hooks = hooks
        self.on_step = on_step
        self._stopping = False
        self._next_index = 0
        self._policy_version = "initial"

    @property
    def workload(self) -> SweWorkload:
        return self.sampler.workload

    def stop(self) -> None:
        """End after the current step: its training and weight push complete, the next
        step's rollout (if started) is cancelled."""
        self._stopping = True

    async def run(self, *, session: aiohttp.ClientSession | None = None) -> list[StepResult]:
        """Run steps until ``config.steps``, ``stop()``, a training failure or cancellation.

        Pass ``session`` to share the application's one ``ClientSession`` (e.g. with
        admin hooks); otherwise the run opens and closes its own.
        """
        if session is None:
            connector = aiohttp.TCPConnector(limit=self.config.max_connections)
            async with aiohttp.ClientSession(connector=connector) as own:
                return await self.run(session=own)
        client = GenerateClient(session, self.router_url, time=self.time,
                                retry_delays_s=self.config.retry_delays_s,
                                request_timeout_s=self.config.request_timeout_s,
                                headers=dict(self.config.headers), front_door=self.front_door)
        sigma = self.config.turns_hint_sigma
        hint = (lambda index: None) if sigma is None else (lambda index: self.sampler.turns_hint(index, sigma))
        return await self._pipeline(TrajectoryContext(self.sampler, self.environment, client,
                                                      policy_version=lambda: self._policy_version,
                                                      turns_hint=hint))

    async def _pipeline(self, ctx: TrajectoryContext) -> list[StepResult]:
        results: list[StepResult] = []
        period_start = self.time.now()
        current = asyncio.create_task(self._rollout(ctx, 0, ()))
        running: Optional[asyncio.Task[_Batch]] = current
        step = 0
        try:
            while True:
                batch = await current
                running = None
                last = self._stopping or (self.config.steps is not None and step + 1 >= self.config.steps)
                train_start = self.time.now()
                # The router closes step k (and takes back what training needs) before the
                # first turn of step k+1 reaches it: that rollout's topology is decided here.
                await self.hooks.train_begin(step)
                if not last:
                    current = running = asyncio.create_task(self._rollout(ctx, step + 1, batch.carried_out))
                result = await self._train(step, batch, period_start, train_start)
                results.append(result)
                period_start = result.end
                log.info("step %d: %.1f s, %.0f tok/s, %d turns, %d errors, %d failed trajectories",
                         step, result.duration_s, result.throughput, result.turns, result.errors,
                         result.failed_trajectories)
                if self.on_step is not None:
                    maybe = self.on_step(result)
                    if inspect.isawaitable(maybe):
                        await maybe
                if last or self._stopping:
                    return results
                step += 1
        finally:
            if running is not None:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)

    async def _rollout(self, ctx: TrajectoryContext, step: int,
                       carried: tuple[PartialTrajectory, ...]) -> _Batch:
        """Run the carried trajectories (first) and new ones up to a full batch; return
        once all of them, or ``carry_over_share`` of them, have finished."""
        b = self.workload.batch_size
        start = self.time.now()
        latest: dict[str, PartialTrajectory] = {p.trajectory_id: p for p in carried}
        plans: list[tuple[int, str, Optional[PartialTrajectory]]] = [
            (p.index, p.trajectory_id, p) for p in carried]
        for _ in range(max(0, b - len(carried))):
            index, self._next_index = self._next_index, self._next_index + 1
            plans.append((index, f"{self.config.trajectory_prefix}-{index}", None))

        def keep(p: PartialTrajectory) -> None:
            latest[p.trajectory_id] = p

        share = self.config.carry_over_share
        target = len(plans) if share is None else min(len(plans), math.ceil(share * b))
        tasks = {asyncio.ensure_future(run_trajectory(ctx, index=index, step=step, trajectory_id=tid,
                                                      resume=resume, on_turn=keep)): (index, tid)
                 for index, tid, resume in plans}
        done: list[asyncio.Task] = []
        pending = set(tasks)
        try:
            while len(done) < target:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in finished:
                    t.result()  # a trajectory never raises for a failed turn; anything else is a bug
                done.extend(finished)
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        # A trajectory that finished while the others were being stopped is kept as finished.
        done.extend(t for t in pending if not t.cancelled() and t.exception() is None)
        stopped = [t for t in pending if t not in done]
        out = []
        for t in stopped:
            index, tid = tasks[t]
            out.append(latest.get(tid) or PartialTrajectory.fresh(
                self.sampler, index=index, step=step, trajectory_id=tid, start=start))
        order = {tid: i for i, (_, tid, _) in enumerate(plans)}
        trajectories = sorted((t.result() for t in done), key=lambda tr: order[tr.trajectory_id])
        return _Batch(tuple(trajectories), start, self.time.now(),
                      carried_in=tuple(p.trajectory_id for p in carried),
                      carried_out=tuple(sorted(out, key=lambda p: order[p.trajectory_id])))

    async def _train(self, step: int, batch: _Batch, period_start: float, train_start: float) -> StepResult:
        """Training after ``train_begin``: ``train_finished`` (also when it fails), then the push."""
        try:
            await self.trainer.train(step, batch.trajectories)
        except Exception as e:
            raise TrainingFailed(step) from e
        finally:
            await self.hooks.train_finished(step)
        train_end = self.time.now()
        version = await self.hooks.push_weights(step)
        self._policy_version = version
        return _step_result(step, batch, period_start=period_start, train_start=train_start,
                            train_end=train_end, end=self.time.now(), version=version)


def _step_result(step: int, batch: _Batch, *, period_start: float, train_start: float,
                 train_end: float, end: float, version: str) -> StepResult:
    trajs: Sequence[Trajectory] = batch.trajectories
    errors = [e for t in trajs for e in t.errors]
    durations = [t.duration_s for t in trajs] or [0.0]
    return StepResult(
        step=step, start=period_start, end=end, rollout_start=batch.start,
        rollout_end=batch.end, train_start=train_start, train_end=train_end, weight_version=version,
        rollout_generated_tokens=sum(t.generated_tokens for t in trajs),
        training_tokens=sum(t.tokens for t in trajs), trajectories=len(trajs),
        failed_trajectories=sum(t.failed for t in trajs), turns=sum(t.turns for t in trajs),
        errors=len(errors), error_samples=tuple(errors[:_ERROR_SAMPLES]),
        mean_trajectory_s=fmean(durations), max_trajectory_s=max(durations),
        telemetry=tuple(x for t in trajs for x in t.telemetry),
        carried_in=batch.carried_in, carried_out=tuple(p.trajectory_id for p in batch.carried_out),
        carried_out_generated_tokens=sum(p.generated for p in batch.carried_out),
        trajectory_ids=tuple(t.trajectory_id for t in trajs))
