"""The latest weight snapshot, and syncing workers to it (lazy propagation).

PEARL keeps only the version and where to load it from. Active workers get each push at
once; a worker that joins or is re-activated later syncs to the latest snapshot after it
starts and before it is admitted, so no request ever reaches a worker on stale weights
beyond the configured staleness. A snapshot pushed over a distributed group exists only in
the workers that received it unless the trainer also saved it (``model_path``); then a
worker that would need it later cannot be synced, and its activation fails.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from pearl_sglang.core.weight_snapshot import WeightSnapshot
from pearl_sglang.workers.client import WorkerClient
from pearl_sglang.workers.errors import WorkerError


class NoDiskCopy(RuntimeError):
    """The worker needs weights that exist only in the workers that received a broadcast."""


def _no_disk_copy(snapshot: WeightSnapshot) -> str:
    return (f"weights of {snapshot.version} have no disk copy to load from (pass 'model_path' with "
            "distributed pushes so that new or relaunched workers can sync)")


def loadable(snapshot: WeightSnapshot) -> bool:
    """Whether a new process can reach ``snapshot``: not when it came over a distributed
    group without ``model_path`` (those weights live only in the processes that received
    them)."""
    return snapshot.model_path is not None or snapshot.group is None


def require_disk_copy(snapshot: WeightSnapshot) -> None:
    if not loadable(snapshot):
        raise NoDiskCopy(_no_disk_copy(snapshot))


async def sync_worker(ops: WorkerClient, url: str, snapshot: WeightSnapshot, *, reload: bool) -> None:
    """Bring one worker to ``snapshot``. ``reload`` forces loading weights even when the
    version already matches (released memory without a CPU backup lost them)."""
    info = await ops.model_info(url)
    if info.get("weight_version") == snapshot.version and not reload:
        return
    if snapshot.model_path is None:
        if reload or not loadable(snapshot):
            raise NoDiskCopy(_no_disk_copy(snapshot))
        await ops.set_version(url, snapshot.version)
        return
    await ops.update_from_disk(url, model_path=snapshot.model_path, version=snapshot.version,
                               load_format=snapshot.load_format)


Push = Callable[[str], Awaitable[None]]


def from_disk(ops: WorkerClient, snapshot: WeightSnapshot) -> Push:
    async def push(url: str) -> None:
        await ops.update_from_disk(url, model_path=snapshot.model_path or "", version=snapshot.version,
                                   load_format=snapshot.load_format)
    return push


async def push_to_workers(urls: list[str], push: Push) -> list[str]:
    """Run ``push`` on every worker at once; per worker ``"ok"`` or the error."""

    async def one(url: str) -> str:
        try:
            await push(url)
            return "ok"
        except WorkerError as e:
            return str(e)

    return list(await asyncio.gather(*(one(u) for u in urls)))
