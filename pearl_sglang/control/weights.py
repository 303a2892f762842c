"""The latest weight snapshot, and syncing workers to it (lazy propagation).

PEARL keeps only the version and where to load it from. Active workers get each push at
once; a worker that joins or is re-activated later syncs to the latest snapshot after it
starts and before it is admitted, so no request ever reaches a worker on stale weights
beyond the configured staleness.
"""
from __future__ import annotations

from dataclasses import dataclass

import asyncio

from pearl_sglang.control.worker_ops import WorkerOpError, WorkerOps


@dataclass(frozen=True)
class WeightSnapshot:
    version: str
    model_path: str | None = None
    load_format: str | None = None

    def to_dict(self) -> dict:
        return {"version": self.version, "model_path": self.model_path, "load_format": self.load_format}


async def sync_worker(ops: WorkerOps, url: str, snapshot: WeightSnapshot, *, reload: bool) -> None:
    """Bring one worker to ``snapshot``. ``reload`` forces loading weights even when the
    version already matches (released memory without a CPU backup lost them)."""
    info = await ops.model_info(url)
    if info.get("weight_version") == snapshot.version and not reload:
        return
    if snapshot.model_path is None:
        if reload:
            raise RuntimeError(f"weights of {snapshot.version} have no disk snapshot to reload from")
        await ops.set_version(url, snapshot.version)
        return
    await ops.update_from_disk(url, model_path=snapshot.model_path, version=snapshot.version,
                               load_format=snapshot.load_format)


async def push_to_workers(ops: WorkerOps, urls: list[str], snapshot: WeightSnapshot) -> list[str]:
    """Load ``snapshot`` on every worker at once; per worker ``"ok"`` or the error."""

    async def one(url: str) -> str:
        try:
            await ops.update_from_disk(url, model_path=snapshot.model_path, version=snapshot.version,
                                       load_format=snapshot.load_format)
            return "ok"
        except WorkerOpError as e:
            return str(e)

    return list(await asyncio.gather(*(one(u) for u in urls)))
