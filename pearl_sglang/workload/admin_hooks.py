"""Train hooks that drive PEARL's admin API through the RL adapter's asyncio client.

This is how the emulated RL job tells PEARL about training (docs/admin-api.md):
``train_begin`` returns only once borrowed training GPUs are free again,
``train_finished`` lets PEARL borrow them, and ``update_weights`` fans the new weights
out to every rollout worker.  Retries, idempotency keys and typed errors are the
adapter's (``AsyncPearlClient``); this module only maps the driver's three hooks onto it.
"""
from __future__ import annotations

from pearl_rl_adapter.aio import AsyncPearlClient
from pearl_sglang.workload.trainer import TrainHooks


def admin_hooks(client: AsyncPearlClient, *, model_path: str, run_id: str = "run",
                train_begin_deadline_s: float | None = None) -> TrainHooks:
    """Hooks for ``AgenticRLDriver``; weights are pushed from disk as ``{run_id}-step-{k}``."""

    async def train_begin(step: int) -> None:
        await client.train_begin(step, deadline_s=train_begin_deadline_s)

    async def train_finished(step: int) -> None:
        await client.train_finished(step)

    async def push_weights(step: int) -> str:
        answer = await client.update_weights_from_disk(version=f"{run_id}-step-{step}",
                                                       model_path=model_path)
        return answer.version

    return TrainHooks(train_begin=train_begin, train_finished=train_finished,
                      push_weights=push_weights)
