"""Loading weights into workers: a push to the active workers (from disk or over a
distributed group), and catching up workers about to be admitted.

Loads run one at a time (``lock``): pushes in arrival order, and admissions take the same
lock, so a worker that synced before a push was adopted loads it before it serves. What a
load means for the control state (the snapshot joiners sync to, the numbered push log)
is the core's (``core.control.PushAdopted``); the distributed group mechanics live in
``weight_group``.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

from pearl_sglang.aio import gather_settled
from pearl_sglang.control.executor import PlanExecutor
from pearl_sglang.control.weight_group import TensorSpecs, WeightGroups
from pearl_sglang.control.weights import from_disk, push_to_workers, sync_worker
from pearl_sglang.core.events import Event, RoleSwitched, SwitchAbandoned, WorkerReady
from pearl_sglang.core.weight_snapshot import WeightSnapshot


# The events that make a worker serve: each says which weights it holds (None: what the
# table says it held).
ADMITTED = (WorkerReady, RoleSwitched, SwitchAbandoned)


class NoActiveWorker(RuntimeError):
    """A push arrived while no worker serves: nothing could load it to prove it loads."""


class WeightLoading:
    def __init__(self, executor: PlanExecutor, groups: WeightGroups) -> None:
        self.executor, self.groups = executor, groups
        self.lock = asyncio.Lock()

    async def push(self, snapshot: WeightSnapshot, tensors: TensorSpecs | None, *,
                   keeping: WeightSnapshot) -> dict[int, str]:
        """Load ``snapshot`` into every active worker (``tensors``: receive it over the
        group ``snapshot.group`` while the trainer broadcasts); each slot's result, "ok"
        or why not. ``keeping``: what the workers keep if none can load it."""
        if tensors is not None:
            tensors.validate()
            await self.groups.ready(snapshot.group or "")
        workers = self.executor.store.table.active()
        if not workers:
            raise NoActiveWorker(f"no active worker to load {snapshot.version}, so it cannot be checked; the "
                                 f"workers keep {keeping.version} (push again once workers serve, see "
                                 "/pearl/state)")
        push = (from_disk(self.executor.ops, snapshot) if tensors is None
                else self.groups.pusher(snapshot.group or "", tensors, snapshot.version, workers))
        with self.executor.data_plane.planned_pause(w.slot for w in workers):
            results = await push_to_workers([w.endpoint for w in workers], push)
        return {w.slot: r for w, r in zip(workers, results)}

    async def catch_up(self, events: list[Event], latest: WeightSnapshot) -> list[Event]:
        """Workers about to be admitted (new, switched, or back in their old role) that
        synced before ``latest`` was adopted, or were switching while it was pushed, load it
        now, all at once like a push (one after another, eight borrowed 30B workers
        waited 8 x 20 s before serving); the caller holds ``lock`` so no push can slip in
        between. The first failure is raised once every load has ended."""
        table = self.executor.store.table
        behind = [i for i, e in enumerate(events) if isinstance(e, ADMITTED)
                  and (e.weight_version or table.worker(e.slot).weight_version) != latest.version]
        loads = await gather_settled(*(sync_worker(self.executor.ops, events[i].endpoint
                                                   or table.worker(events[i].slot).endpoint, latest, reload=False)
                                       for i in behind))
        for outcome in loads:
            if isinstance(outcome, BaseException):
                raise outcome
        caught_up = list(events)
        for i in behind:
            caught_up[i] = replace(events[i], weight_version=latest.version)
        return caught_up
