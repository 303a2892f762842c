"""The training side of the emulated RL job: how long a step takes and whom it tells.

The trainer itself is emulated (a ``TrainerProfile`` turned into a wait), but the
signals around it are the real contract with PEARL: ``train_begin`` before the
training GPUs are needed (PEARL reclaims borrowed ones), ``train_finished`` when they
are idle again (PEARL may borrow them), and ``push_weights`` after every update so
rollout workers sync to the new version.  The hooks are injected; a demo wires them to
the router's admin API, tests record their order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.workload.results import Trajectory
from pearl_sglang.workload.timebase import EmulatedTime


@dataclass(frozen=True)
class TrainerProfile:
    """Emulated training time: ``seconds_per_step + seconds_per_token x batch tokens``."""

    seconds_per_step: float = 160.0
    seconds_per_token: float = 0.0

    def validate(self) -> None:
        if self.seconds_per_step < 0 or self.seconds_per_token < 0:
            raise InvalidConfig("training times must be >= 0", key="seconds_per_step")

    def duration_s(self, training_tokens: int) -> float:
        return self.seconds_per_step + self.seconds_per_token * training_tokens


class Trainer(Protocol):
    async def train(self, step: int, batch: Sequence[Trajectory]) -> None:
        """Consume one complete batch; may raise (the driver still sends train_finished)."""


class EmulatedTrainer:
    def __init__(self, profile: TrainerProfile, *, time: EmulatedTime) -> None:
        profile.validate()
        self.profile, self.time = profile, time

    async def train(self, step: int, batch: Sequence[Trajectory]) -> None:
        await self.time.wait(self.profile.duration_s(sum(t.tokens for t in batch)))


async def _nothing(step: int) -> None:
    return None


async def _version(step: int) -> str:
    return f"step-{step}"


@dataclass(frozen=True)
class TrainHooks:
    """Async callbacks around each training step (all take the step index)."""

    train_begin: Callable[[int], Awaitable[None]] = _nothing
    train_finished: Callable[[int], Awaitable[None]] = _nothing
    push_weights: Callable[[int], Awaitable[str]] = _version
