"""Carry out a minimal-change plan against real workers (both executors' shared path).

The Inter-Scale Rebuilder and the Intra-Scale Toggle Manager consume the same plan
format and differ only in urgency, so the physical steps live here once:

* ``deactivate``: a LEAVING worker stops receiving requests (the table already says so),
  its in-flight items are migrated with their partial output, then an overlap worker is
  paused and releases its GPU memory (process kept) while a dedicated one is stopped.
  If a worker refuses to drain by the deadline, or cannot release, it is killed: a GPU is
  never reported free while a rollout process may still hold memory on it.
* ``switch``: prefill <-> decode in place through ``/pd_role_switch`` on the drained
  instance; colocated <-> PD by relaunching the process in the same slot and GPUs.
* ``activate``: resume a retained overlap process or launch a new one, then sync it to
  the latest weight snapshot (lazy propagation).
* ``admit``: the ready events of one group applied together under a brief admission
  pause, so a request never reaches a half-ready group.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Callable

from pearl_sglang.aio import gather_settled
from pearl_sglang.control.cluster_config import Deadlines
from pearl_sglang.control.data_plane import DataPlane
from pearl_sglang.control.launchers import Launcher, LaunchError, LaunchSpec
from pearl_sglang.control.phases import PhaseLog
from pearl_sglang.control.weights import require_disk_copy, sync_worker
from pearl_sglang.core.weight_snapshot import WeightSnapshot
from pearl_sglang.core.events import (
    ActivationAbandoned, Event, RoleSwitched, SwitchAbandoned, WorkerLeft, WorkerLost, WorkerReady,
    WorkerUnregistered,
)
from pearl_sglang.core.planner import WorkerAdd
from pearl_sglang.core.registered import is_registered
from pearl_sglang.core.state import Activity, Role, WorkerRecord, Zone
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import WorkerClient
from pearl_sglang.workers.errors import WorkerError, WorkerRefused

log = logging.getLogger("pearl.control")

RESTORE_ATTEMPTS = 3
NOT_IDLE = "instance is not idle"  # SGLang's refusal of /pd_role_switch while requests remain
IDLE_POLL_S = 0.5

_MODE_TO_ROLE = {"null": Role.COLOCATED, "prefill": Role.PREFILL, "decode": Role.DECODE}


class ActivationFailed(RuntimeError):
    """A worker of a group could not be made ready; the whole group is cancelled."""


class GroupCancelled(ActivationFailed):
    """A group was cancelled because some of its workers could not be made ready."""


class PdProbeFailed(ActivationFailed):
    """A new pair could not transfer KV; relaunching its workers may fix it, so the
    control plane re-plans after a back-off."""


@dataclass
class PlanExecutor:
    store: StateStore
    data_plane: DataPlane
    launcher: Launcher | None
    ops: WorkerClient
    phases: PhaseLog
    deadlines: Deadlines
    snapshot: Callable[[], WeightSnapshot]
    launch_version: str = "default"
    weights_cpu_backup: bool = False
    # Retained workers whose memory is released and not known to be back: a re-activation
    # cancelled before its resume leaves it so, and a second release is refused.
    released: set[int] = field(default_factory=set)

    async def _drain(self, slot: int) -> bool:
        drained = await self.data_plane.drain(slot, self.deadlines.drain_s)
        if not drained:
            log.warning("slot %s did not drain in %.0fs; stopping it anyway", slot, self.deadlines.drain_s)
        return drained

    def _retained(self, w: WorkerRecord) -> bool:
        """A JOINING overlap worker that is a kept process being re-activated (a new one has
        no endpoint until it is ready)."""
        return (w.zone is Zone.OVERLAP and w.activity is Activity.JOINING and bool(w.endpoint)
                and self._launched(w) and self.launcher.alive(w.slot))

    def _launched(self, w: WorkerRecord) -> bool:
        """Whether PEARL's launcher owns this worker's process (registered engines are the
        framework's: never relaunched, stopped or judged by the launcher's liveness)."""
        return self.launcher is not None and not is_registered(w)

    async def kill(self, slot: int) -> None:
        self.released.discard(slot)
        table = self.store.table
        if self.launcher is not None and not (table.has(slot) and is_registered(table.worker(slot))):
            await self.launcher.stop(slot)

    async def deactivate(self, slot: int, operation: str) -> Event:
        """Returns the event to apply: WorkerLeft, or WorkerLost if the process had to go."""
        w = self.store.table.worker(slot)
        async with self.phases.phase(operation, "deactivation"):
            await self._drain(slot)
            if w.zone is Zone.OVERLAP and w.endpoint:
                return WorkerLeft(slot) if await self._released(slot, w.endpoint) else WorkerLost(slot)
            if is_registered(w):
                # The framework owns the process: it leaves PEARL, GPU ids and all.
                return WorkerUnregistered(slot)
            await self.kill(slot)
            return WorkerLeft(slot)

    async def _released(self, slot: int, endpoint: str) -> bool:
        """An overlap worker's memory released, its process kept (True); stopped when it
        cannot release (False)."""
        try:
            await self.ops.pause(endpoint, "abort")
            try:
                await self.ops.release_memory(endpoint)
            except WorkerError as e:
                if slot not in self.released:
                    raise
                # Its re-activation was cancelled before the memory came back: the refusal
                # says it is still released. Kept, as a release would.
                log.info("slot %s kept its memory released (%s)", slot, e)
                return True
            if await self.ops.frees_memory_on_release(endpoint) is False:
                raise WorkerRefused(endpoint, "the worker runs without the memory saver, so the "
                                    "release freed nothing (set engine.memory_saver: true)",
                                    path="/release_memory_occupation")
            self.released.add(slot)
            return True
        except WorkerError as e:
            log.warning("slot %s could not release memory (%s); killing it", slot, e)
            await self.kill(slot)
            return False

    async def _actual_role(self, url: str) -> Role:
        info = await self.ops.model_info(url)
        return _MODE_TO_ROLE.get(str(info.get("disaggregation_mode")), Role.COLOCATED)

    async def _become(self, slot: int, url: str, role: Role, gpus: tuple[str, ...]) -> tuple[str, int | None]:
        """Give the process in ``slot`` the role ``role``: in place for P <-> D, else relaunch."""
        w = self.store.table.worker(slot)
        if self._launched(w) and not self.launcher.alive(slot):
            # Its process is gone (a relaunch cancelled half-way by a mandatory event): start
            # it in the new role instead of asking a dead endpoint what it is.
            return await self._relaunch(slot, role, gpus)
        current = await self._actual_role(url)
        if current is role:
            return url, w.bootstrap_port
        if {current, role} == {Role.PREFILL, Role.DECODE}:
            await self._switch_when_idle(url, role)
            if await self._actual_role(url) is not role:
                raise ActivationFailed(f"slot {slot} still is {current.value} after /pd_role_switch")
            return url, w.bootstrap_port
        if self.launcher is None or is_registered(w):
            raise ActivationFailed(f"slot {slot}: {current.value} -> {role.value} needs a relaunch, "
                                   "and attached or registered workers cannot be relaunched")
        return await self._relaunch(slot, role, gpus)

    async def _switch_when_idle(self, url: str, role: Role) -> None:
        """``/pd_role_switch`` once the engine is idle. The drain empties the router's own
        registry at once, but SGLang's prefill keeps a moved request until its KV sender
        learns that the decode gave it up, and refuses the switch until then ("instance is
        not idle"): asked again every ``IDLE_POLL_S``, up to the drain deadline."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.deadlines.drain_s
        while True:
            try:
                await self.ops.switch_role(url, role.value)
                if loop.time() - started >= IDLE_POLL_S:
                    log.info("%s switched to %s after %.1fs waiting for it to be idle",
                             url, role.value, loop.time() - started)
                return
            except WorkerError as e:
                if NOT_IDLE not in str(e) or loop.time() + IDLE_POLL_S > deadline:
                    raise
            await asyncio.sleep(IDLE_POLL_S)

    async def _relaunch(self, slot: int, role: Role, gpus: tuple[str, ...]) -> tuple[str, int | None]:
        # Before the process that holds the weights stops: a new one could not load them.
        require_disk_copy(self.snapshot())
        await self.launcher.stop(slot)
        launched = await self.launcher.launch(LaunchSpec(slot, role, gpus, self.launch_version))
        return launched.endpoint, launched.bootstrap_port

    async def switch(self, slot: int, operation: str) -> Event:
        w = self.store.table.worker(slot)
        if w.held:
            # It lost its partner and keeps its role, but a growth cancelled during an
            # in-place P <-> D switch may have left its process in the other role: ask it
            # (one call when it is right) before it is probed and admitted.
            endpoint, port = await self._become(slot, w.endpoint, w.role, w.gpus)
            if (endpoint, port) == (w.endpoint, w.bootstrap_port):
                return RoleSwitched(slot)
            return RoleSwitched(slot, endpoint=endpoint, bootstrap_port=port,
                                weight_version=await self._synced(endpoint))
        async with self.phases.phase(operation, "role_switch"):
            await self._drain(slot)
            endpoint, port = await self._become(slot, w.endpoint, w.pending_role, w.gpus)
            return RoleSwitched(slot, endpoint=endpoint, bootstrap_port=port,
                                weight_version=await self._synced(endpoint))

    async def _synced(self, endpoint: str) -> str:
        """Load the latest snapshot into ``endpoint`` (again, if a push was adopted while it
        loaded); the version it now holds, for the table."""
        while True:
            latest = self.snapshot()
            await sync_worker(self.ops, endpoint, latest, reload=False)
            if self.snapshot().version == latest.version:
                return latest.version

    async def activate(self, add: WorkerAdd, operation: str) -> Event:
        snapshot = self.snapshot()
        w = self.store.table.worker(add.slot)
        zone = w.zone.value
        if add.retained:
            async with self.phases.phase(operation, "activation", zone):
                await self.ops.resume_memory(w.endpoint)
                self.released.discard(add.slot)
                await sync_worker(self.ops, w.endpoint, snapshot, reload=not self.weights_cpu_backup)
                endpoint, port = await self._become(add.slot, w.endpoint, add.role, add.gpus)
                await self.ops.resume_generation(endpoint)
            return WorkerReady(add.slot, endpoint=endpoint, bootstrap_port=port, weight_version=snapshot.version)
        if self.launcher is None:
            raise ActivationFailed("attached clusters cannot launch workers")
        async with self.phases.phase(operation, "preparation", zone):
            # A new process holds the launch checkpoint; it then syncs to the latest snapshot.
            require_disk_copy(snapshot)
            launched = await self.launcher.launch(LaunchSpec(add.slot, add.role, add.gpus,
                                                             self.launch_version))
            latest = self.snapshot()
            await sync_worker(self.ops, launched.endpoint, latest, reload=False)
        return WorkerReady(add.slot, endpoint=launched.endpoint, bootstrap_port=launched.bootstrap_port,
                           weight_version=latest.version)

    async def verify_pd(self, events: list[Event]) -> None:
        """Probe every new or re-activated PD worker with a partner before admission (the
        KV-transfer metadata refresh after resume, or a fresh pair, is proven by a real
        transfer). A failure cancels the group; the control plane then re-plans, which
        relaunches its workers and pairs them again."""
        table = self.store.table
        fresh: dict[Role, list[tuple[int, str, int | None]]] = {Role.PREFILL: [], Role.DECODE: []}
        for e in events:
            w = table.worker(e.slot)
            role = w.pending_role if isinstance(e, RoleSwitched) and w.pending_role else w.role
            endpoint = e.endpoint or w.endpoint
            port = e.bootstrap_port if e.bootstrap_port is not None else w.bootstrap_port
            if role in fresh and endpoint:
                fresh[role].append((e.slot, endpoint, port))
        partners = {r: [(w.slot, w.endpoint, w.bootstrap_port) for w in table.active(r)] + fresh[r]
                    for r in fresh}
        probes = []
        for role, workers in fresh.items():
            other = Role.DECODE if role is Role.PREFILL else Role.PREFILL
            for worker in workers:
                if not partners[other]:
                    continue
                partner = partners[other][0]
                prefill, decode = (worker, partner) if role is Role.PREFILL else (partner, worker)
                if prefill[2] is None:
                    raise ActivationFailed(f"prefill in slot {prefill[0]} has no bootstrap port")
                probes.append(self.ops.pd_probe(prefill_url=prefill[1], bootstrap_port=prefill[2],
                                                decode_url=decode[1]))
        try:
            outcomes = await asyncio.wait_for(gather_settled(*probes), self.deadlines.drain_s + 30)
        except asyncio.TimeoutError as e:
            raise PdProbeFailed("PD probe timed out before admission") from e
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise PdProbeFailed(f"PD probe failed before admission: {failed[0]!r}") from failed[0]

    async def admit(self, events: list[Event], operation: str) -> None:
        if not events:
            return
        async with self.phases.phase(operation, "finalization"):
            async with self.data_plane.admission_paused(f"{operation}: admitting {len(events)} worker(s)"):
                await self.store.apply(events)
                self._forget_failures(events)

    async def cancel_group(self, slots: list[int], reached: list[Event] | None = None) -> None:
        """All-or-nothing: stop every joining worker of a failed group and drop it from the
        table; a worker that was switching to a new role goes back to its old one (in
        place, or relaunched if its process is gone), so the cluster keeps serving the old
        topology rather than losing it; only a worker that cannot go back is stopped.
        Held workers, which were not touched, stay held. ``reached``: the events of the
        group's workers that did get ready (a relaunched worker's new endpoint is there)."""
        table = self.store.table
        joining = [s for s in slots if table.has(s) and table.worker(s).activity is Activity.JOINING]
        switching = [s for s in slots if table.has(s) and table.worker(s).activity is Activity.SWITCHING
                     and not table.worker(s).held]
        # A retained overlap worker being re-activated keeps its process (released again).
        retained = [s for s in joining if self._retained(table.worker(s))]
        kept = {s for s in retained if await self._released(s, table.worker(s).endpoint or "")}
        joining = [s for s in joining if s not in retained]
        for slot in joining:
            await self.kill(slot)
        now_at = {e.slot: (e.endpoint, e.bootstrap_port) for e in reached or ()
                  if isinstance(e, RoleSwitched) and e.endpoint}
        restored = await gather_settled(*(self._restore(s, now_at.get(s)) for s in switching))
        events: list[Event] = []
        for slot, outcome in zip(switching, restored):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                log.warning("slot %s could not go back to its old role (%s); stopping it", slot, outcome)
                await self.kill(slot)
                events.append(WorkerLost(slot))
            else:
                events.insert(0, outcome)
        # A push adopted while the others went back: load it, with no wait between the last
        # check and the table (it did not reach workers that were switching).
        while behind := [i for i, e in enumerate(events)
                         if isinstance(e, SwitchAbandoned) and e.weight_version != self.snapshot().version]:
            for i in behind:
                endpoint = events[i].endpoint or self.store.table.worker(events[i].slot).endpoint
                events[i] = replace(events[i], weight_version=await self._synced(endpoint))
        events += [WorkerLost(s) for s in joining] + [ActivationAbandoned(s) if s in kept else WorkerLost(s)
                                                      for s in retained]
        if events:
            await self.store.apply(events)
            self._forget_failures(events)

    async def drop_dead_switches(self) -> None:
        """After a cancelled growth: a worker whose switch was cancelled half-way through
        its relaunch has no process any more; left SWITCHING, a re-plan that keeps its old
        role would mark it ACTIVE at a dead endpoint. It is dropped instead, and the next
        plan starts a worker on its GPUs."""
        dead = [w.slot for w in self.store.table.rollout_workers()
                if w.activity is Activity.SWITCHING and not w.held and self._launched(w)
                and not self.launcher.alive(w.slot)]
        if dead:
            log.warning("slots %s lost their process in a cancelled switch; dropping them", dead)
            await self.store.apply([WorkerLost(s) for s in dead])

    def _forget_failures(self, events: list[Event]) -> None:
        """A slot that now runs a new or restarted process starts with a closed circuit:
        failures counted against the process it replaced say nothing about this one."""
        for e in events:
            if isinstance(e, (WorkerReady, RoleSwitched, SwitchAbandoned)) and e.endpoint:
                self.data_plane.process_replaced(e.slot)

    async def _restore(self, slot: int, now_at: tuple[str, int | None] | None) -> Event:
        """Back to the old role; a start that fails is tried again (up to
        ``RESTORE_ATTEMPTS``), since losing the worker is worse than a late return."""
        w = self.store.table.worker(slot)
        url = now_at[0] if now_at else w.endpoint
        for attempt in range(RESTORE_ATTEMPTS):
            try:
                endpoint, port = await self._become(slot, url, w.role, w.gpus)
                return SwitchAbandoned(slot, endpoint=endpoint, bootstrap_port=port,
                                       weight_version=await self._synced(endpoint))
            except (LaunchError, WorkerError, ActivationFailed, OSError):
                if attempt == RESTORE_ATTEMPTS - 1 or self.launcher is None:
                    raise
                await self.launcher.stop(slot)  # the next attempt relaunches it
        raise AssertionError("unreachable")
