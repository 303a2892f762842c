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

from pearl_sglang.control.weights import NoDiskCopy, sync_worker
from pearl_sglang.core.weight_snapshot import WeightSnapshot
from pearl_sglang.core.events import WorkerRegistered, WorkerUnregistered, WorkerUnregistering
from pearl_sglang.core.registered import GPU_PREFIX, RegistrationConfig
from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.addresses import check_port, check_worker_url
from pearl_sglang.workers.client import WorkerClient
from pearl_sglang.workers.errors import WorkerError


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


class MissingCapability(RegistrationError):
    """The worker lacks what its zone needs (an overlap worker must release its memory)."""


@dataclass(frozen=True)
class Capabilities:
    """What PEARL may do to a registered worker in place. ``None``: ask the worker."""

    memory_saver: bool | None = None  # release/resume memory: needed to borrow training GPUs
    pd_role_switch: bool | None = None  # /pd_role_switch: prefill <-> decode without a relaunch

    def to_dict(self) -> dict[str, bool | None]:
        return {"memory_saver": self.memory_saver, "pd_role_switch": self.pd_role_switch}


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    role: Role = Role.COLOCATED
    bootstrap_port: int | None = None
    zone: Zone = Zone.DEDICATED
    capabilities: Capabilities = Capabilities()

    def validate(self) -> None:
        check_worker_url(self.url)
        if self.role is Role.TRAINING:
            raise ValueError("a registered worker is prefill, decode or regular")
        if self.bootstrap_port is not None:
            check_port(self.bootstrap_port, "bootstrap port")


Snapshot = Callable[[], "WeightSnapshot | None"]
Drain = Callable[[int, float], Awaitable[bool]]


def normalize(url: str) -> str:
    return url.rstrip("/")


def find(table: StateTable, url: str) -> WorkerRecord | None:
    url = normalize(url)
    return next((w for w in table.rollout_workers() if w.endpoint == url), None)


def capabilities(given: Capabilities, info: dict) -> Capabilities:
    """What the registration says, filled in from the worker's ``/server_info``. The
    worker's own ``enable_memory_saver: false`` outranks a claim of ``memory_saver: true``:
    SGLang without the memory saver answers a release with success and frees nothing, so
    trusting the claim would hand training GPUs back that are still full. Pure."""
    reported = info.get("enable_memory_saver")
    memory_saver = given.memory_saver if given.memory_saver is not None else bool(reported)
    if reported is False:
        memory_saver = False
    pd_role_switch = (given.pd_role_switch if given.pd_role_switch is not None
                      else bool(info.get("enable_pd_role_switch")))
    return Capabilities(memory_saver=memory_saver, pd_role_switch=pd_role_switch)


def _bootstrap_port(info: dict) -> int | None:
    """A decode worker's own bootstrap port (registration names only a prefill worker's):
    it needs one once PEARL switches it to prefill."""
    port = info.get("disaggregation_bootstrap_port")
    return port if isinstance(port, int) and not isinstance(port, bool) else None


class Registrar:
    """Adds and removes registered workers; ``drain(slot, timeout_s)`` moves a worker's
    in-flight requests elsewhere and says whether it emptied in time."""

    def __init__(self, *, store: StateStore, ops: WorkerClient, snapshot: Snapshot, drain: Drain,
                 config: RegistrationConfig = RegistrationConfig()) -> None:
        config.validate()
        self.store, self.ops, self.snapshot, self.drain, self.config = store, ops, snapshot, drain, config
        self._pending: set[str] = set()
        self.capabilities: dict[str, Capabilities] = {}

    async def add(self, spec: WorkerSpec) -> WorkerRecord:
        spec.validate()
        url = normalize(spec.url)
        if url in self._pending or find(self.store.table, url) is not None:
            raise AlreadyRegistered(f"worker {url} is already registered")
        self._pending.add(url)
        try:
            await self._wait_healthy(url)
            info = await self._server_info(url)
            caps = capabilities(spec.capabilities, info)
            if spec.zone is Zone.OVERLAP and not caps.memory_saver:
                said = (" (its /server_info says enable_memory_saver: false, so a release would answer "
                        "success and free nothing)" if info.get("enable_memory_saver") is False else "")
                raise MissingCapability(f"worker {url} is on training GPUs (zone overlap) but cannot release "
                                        f"its memory{said}: start it with --enable-memory-saver")
            version = await self._sync(url)
            port = spec.bootstrap_port
            if port is None and spec.role is not Role.COLOCATED:
                port = _bootstrap_port(info)
            if spec.zone is Zone.OVERLAP and self.store.table.overlap_owner is not OverlapOwner.ROLLOUT:
                await self._hand_back(url)
            async with self.store.lock:
                table = self.store.table
                slot = next(iter(table.free_slots()))
                gpus = tuple(f"{GPU_PREFIX}-{slot}:{i}" for i in range(table.tp_size))
                self.store.apply_locked([WorkerRegistered(
                    slot=slot, gpus=gpus, role=spec.role, endpoint=url, bootstrap_port=port,
                    weight_version=version, zone=spec.zone)])
                self.capabilities[url] = caps
                return self.store.table.worker(slot)
        finally:
            self._pending.discard(url)

    async def _server_info(self, url: str) -> dict:
        try:
            info = await self.ops.server_info(url)
        except WorkerError:
            return {}
        return info if isinstance(info, dict) else {}

    async def _hand_back(self, url: str) -> None:
        """Training owns the overlap GPUs: the worker gives its memory back before it is
        admitted as a retained process, to be resumed when PEARL borrows."""
        try:
            await self.ops.pause(url, "abort")
            await self.ops.release_memory(url)
        except WorkerError as e:
            raise MissingCapability(f"worker {url} could not release its memory for training: {e}") from e

    async def _wait_healthy(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout_s
        while True:
            try:
                await self.ops.health(url, timeout_s=max(self.config.poll_interval_s, 5.0))
                return
            except WorkerError as e:
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
        except (WorkerError, NoDiskCopy) as e:
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
            if w.is_member:
                self.store.apply_locked([WorkerUnregistering(slot=w.slot)])
        if w.is_member or w.activity is Activity.LEAVING:
            await self.drain(w.slot, self.config.drain_timeout_s)
        async with self.store.lock:
            if self.store.table.has(w.slot) and self.store.table.worker(w.slot).endpoint == url:
                self.store.apply_locked([WorkerUnregistered(slot=w.slot)])
        self.capabilities.pop(url, None)
        return w.slot
