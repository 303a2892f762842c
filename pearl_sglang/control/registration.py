"""Workers that an RL framework started and registers with the router (sglang-router's
worker API), admitted into and removed from the one state table.

An added worker must answer ``/health`` (within the startup timeout, polled every
``poll_interval_s``), is synced to PEARL's latest weight snapshot when PEARL holds one, and
only then enters the table, in one event, so a request never reaches a worker that is
still loading or on stale weights. A removed worker leaves routing first, then its
in-flight requests are moved off it with their partial output kept (the router resubmits
them elsewhere), and only then does its slot go: nothing a trajectory generated is lost.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

from pearl_sglang.control.state_store import StateStore
from pearl_sglang.control.weights import NoDiskCopy, WeightSnapshot, sync_worker
from pearl_sglang.control.worker_ops import WorkerOpError, WorkerOps
from pearl_sglang.core.events import GpusLeave, WorkerLeft, WorkerRegistered
from pearl_sglang.core.state import Activity, Role, StateTable, WorkerRecord

GPU_PREFIX = "registered"


class RegistrationError(RuntimeError):
    """A worker could not be added or removed; the message says why."""


class AlreadyRegistered(RegistrationError):
    pass


class NotRegistered(RegistrationError):
    pass


class WorkerNotReady(RegistrationError):
    """The worker did not answer ``/health`` within the startup timeout."""


class WeightSyncFailed(RegistrationError):
    pass


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    role: Role = Role.COLOCATED
    bootstrap_port: int | None = None

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"worker URL must start with http:// or https://: {self.url!r}")
        if self.role is Role.TRAINING:
            raise ValueError("a registered worker is prefill, decode or regular")
        if self.bootstrap_port is not None and not 0 < self.bootstrap_port < 65536:
            raise ValueError(f"bootstrap port must be in [1, 65535], got {self.bootstrap_port}")


@dataclass(frozen=True)
class RegistrationConfig:
    startup_timeout_s: float = 600.0  # sglang-router's --worker-startup-timeout-secs
    poll_interval_s: float = 1.0
    drain_timeout_s: float = 60.0

    def validate(self) -> None:
        if not (self.startup_timeout_s > 0 and self.poll_interval_s > 0 and self.drain_timeout_s > 0):
            raise ValueError("registration timeouts and the poll interval must be positive")


Snapshot = Callable[[], "WeightSnapshot | None"]
Drain = Callable[[int, float], Awaitable[bool]]


def normalize(url: str) -> str:
    return url.rstrip("/")


def find(table: StateTable, url: str) -> WorkerRecord | None:
    url = normalize(url)
    return next((w for w in table.rollout_workers() if w.endpoint == url), None)


class Registrar:
    """Adds and removes registered workers; ``drain(slot, timeout_s)`` moves a worker's
    in-flight requests elsewhere and says whether it emptied in time."""

    def __init__(self, *, store: StateStore, ops: WorkerOps, snapshot: Snapshot, drain: Drain,
                 config: RegistrationConfig = RegistrationConfig()) -> None:
        config.validate()
        self.store, self.ops, self.snapshot, self.drain, self.config = store, ops, snapshot, drain, config
        self._pending: set[str] = set()

    async def add(self, spec: WorkerSpec) -> WorkerRecord:
        spec.validate()
        url = normalize(spec.url)
        if url in self._pending or find(self.store.table, url) is not None:
            raise AlreadyRegistered(f"worker {url} is already registered")
        self._pending.add(url)
        try:
            await self._wait_healthy(url)
            version = await self._sync(url)
            async with self.store.lock:
                table = self.store.table
                slot = next(iter(table.free_slots()))
                gpus = tuple(f"{GPU_PREFIX}-{slot}:{i}" for i in range(table.tp_size))
                self.store.apply_locked([WorkerRegistered(
                    slot=slot, gpus=gpus, role=spec.role, endpoint=url, bootstrap_port=spec.bootstrap_port,
                    weight_version=version)])
                return self.store.table.worker(slot)
        finally:
            self._pending.discard(url)

    async def _wait_healthy(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout_s
        while True:
            try:
                await self.ops.health(url, timeout_s=max(self.config.poll_interval_s, 5.0))
                return
            except WorkerOpError as e:
                if loop.time() + self.config.poll_interval_s > deadline:
                    raise WorkerNotReady(f"worker {url} did not become healthy within "
                                         f"{self.config.startup_timeout_s:.0f}s: {e}") from e
            await asyncio.sleep(self.config.poll_interval_s)

    async def _sync(self, url: str) -> str | None:
        """Load PEARL's latest snapshot if the worker serves another version; returns the
        version the worker serves once admitted."""
        snapshot = self.snapshot()
        try:
            if snapshot is not None:
                await sync_worker(self.ops, url, snapshot, reload=False)
                return snapshot.version
            info = await self.ops.model_info(url)
        except (WorkerOpError, NoDiskCopy) as e:
            raise WeightSyncFailed(f"worker {url} could not be synced to the latest weights: {e}") from e
        version = info.get("weight_version") if isinstance(info, dict) else None
        return version if isinstance(version, str) else None

    async def remove(self, url: str) -> int:
        """Take the worker out of routing, drain it, drop it; returns its slot."""
        url = normalize(url)
        async with self.store.lock:
            w = find(self.store.table, url)
            if w is None:
                raise NotRegistered(f"worker {url} is not registered")
            if w.activity is not Activity.LEAVING:
                self.store.apply_locked([GpusLeave(gpus=w.gpus)])
        await self.drain(w.slot, self.config.drain_timeout_s)
        async with self.store.lock:
            if self.store.table.has(w.slot) and self.store.table.worker(w.slot).activity is Activity.LEAVING:
                self.store.apply_locked([WorkerLeft(slot=w.slot)])
        return w.slot
