"""Weight pushes of the control plane: from disk or over a distributed group, numbered as
adopted, with workers beyond the staleness bound replaced.

A mixin of ``Orchestrator`` (it uses its store, executor, lock, push log and re-planning);
kept apart so the event handling and the weight lifecycle read separately. The
distributed group mechanics live in ``weight_group``.

Pushes run one at a time (``_pushing``), and the snapshot that joining and re-activated
workers sync to is always the latest push some worker loaded: a racing bad push can
neither replace it nor roll it back. Admission takes the same lock, so a worker that
synced before a push was adopted loads it before it serves.
"""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from pearl_sglang.aio import gather_settled
from pearl_sglang.control.weight_group import GroupSpec, TensorSpecs
from pearl_sglang.control.weights import WeightSnapshot, from_disk, push_to_workers, sync_worker
from pearl_sglang.core.events import Event, WeightsUpdated, WorkerLost, WorkerReady

if TYPE_CHECKING:
    from pearl_sglang.control.orchestrator import Orchestrator


class NoActiveWorker(RuntimeError):
    """A push arrived while no worker serves: nothing could load it to prove it loads."""


class WeightPushes:
    async def update_weights(self: "Orchestrator", *, snapshot: WeightSnapshot,
                             tensors: TensorSpecs | None = None, request_id: str | None = None) -> dict[str, Any]:
        """Push ``snapshot`` from disk, or, with ``tensors``, receive it over the
        distributed group ``snapshot.group`` while the trainer broadcasts."""
        params = {"snapshot": asdict(snapshot), "tensors": asdict(tensors) if tensors is not None else None}
        return await self._once("update_weights", request_id, params, lambda: self._update_weights(snapshot, tensors))

    async def _update_weights(self: "Orchestrator", snapshot: WeightSnapshot,
                              tensors: TensorSpecs | None) -> dict[str, Any]:
        async with self._pushing:  # one push at a time, in arrival order
            answer = await self._push(snapshot, tensors)
        await self._repair_stale()
        return answer

    async def _push(self: "Orchestrator", snapshot: WeightSnapshot, tensors: TensorSpecs | None) -> dict[str, Any]:
        """Push to every active worker; the snapshot joiners sync to becomes ``snapshot``
        only once some worker has loaded it (a push nobody could load changes nothing)."""
        if tensors is not None:
            tensors.validate()
            await self.groups.ready(snapshot.group or "")
        workers = self.store.table.active()
        if not workers:
            raise NoActiveWorker(f"no active worker to load {snapshot.version}, so it cannot be checked; the "
                                 f"workers keep {self.snapshot.version} (push again once workers serve, see "
                                 "/pearl/state)")
        push = (from_disk(self.executor.ops, snapshot) if tensors is None
                else self.groups.pusher(snapshot.group or "", tensors, snapshot.version, workers))
        with self.executor.data_plane.planned_pause(w.slot for w in workers):
            results = await push_to_workers([w.endpoint for w in workers], push)
        answer = {str(w.slot): r for w, r in zip(workers, results)}
        ok = tuple(w.slot for w, r in zip(workers, results) if r == "ok")
        if ok:
            async with self.store.lock:  # the table and the push log change together
                # A worker may have left while it loaded (a preemption): record only those still here.
                here = tuple(s for s in ok if self.store.table.has(s))
                if here:
                    self.store.apply_locked([WeightsUpdated(here, snapshot.version)])
                self.pushes = self.pushes.adopt(snapshot.version)
                self.snapshot = snapshot  # joiners and re-activations sync to it from now on
            self._persist()
        return {"version": snapshot.version, "latest": self.snapshot.version, "applied": bool(ok),
                "workers": answer, "push": self.pushes.number}

    async def _catch_up(self: "Orchestrator", events: list[Event]) -> list[Event]:
        """Workers about to be admitted that synced before the latest push was adopted
        load it now, all at once like a push (one after another, eight borrowed 30B
        workers waited 8 x 20 s before serving); the caller holds ``_pushing`` so no push
        can slip in between. The first failure is raised once every load has ended."""
        latest = self.snapshot
        behind = [i for i, e in enumerate(events)
                  if isinstance(e, WorkerReady) and e.weight_version != latest.version]
        loads = await gather_settled(*(sync_worker(self.executor.ops, events[i].endpoint, latest, reload=False)
                                       for i in behind))
        for outcome in loads:
            if isinstance(outcome, BaseException):
                raise outcome
        caught_up = list(events)
        for i in behind:
            caught_up[i] = replace(events[i], weight_version=latest.version)
        return caught_up

    async def _repair_stale(self: "Orchestrator") -> None:
        """A worker beyond the staleness bound (by default: any that missed the last
        adopted push) must not serve: it leaves, and a new plan brings a replacement up at
        the latest snapshot on the same GPUs."""
        if all(self.pushes.servable(w.weight_version) for w in self.store.table.active()):
            return
        async with self._lock:  # decided on the table as it is under the lock
            stale = [w.slot for w in self.store.table.active() if not self.pushes.servable(w.weight_version)]
            if not stale:
                return
            await self.store.apply([WorkerLost(s) for s in stale])
            for s in stale:
                await self.executor.kill(s)
            await self._regrow("weights_repair", "weights_repair", borrow=self.borrowing)

    async def weight_group(self: "Orchestrator", *, spec: GroupSpec | None = None,
                           destroy: str | None = None, request_id: str | None = None) -> dict[str, Any]:
        """Create ``spec`` (members: the active workers now) or destroy the group named
        ``destroy``."""
        async def act() -> dict[str, Any]:
            if spec is None:
                return await self.groups.destroy(destroy or "")
            async with self._lock:
                return self.groups.init(spec, self.store.table.active(), self.config.engine.tp_size)
        params = {"spec": asdict(spec) if spec is not None else None, "destroy": destroy}
        return await self._once("weight_group", request_id, params, act)
