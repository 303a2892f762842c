"""After a restart: make the recovered table agree with the workers that actually exist.

The record says what the control plane believed and was doing; the workers say what is
true. Rules (each chosen so that a GPU is never reported free while a rollout process
may still hold memory on it, and no request reaches a worker in an unknown state):

* a worker that does not answer ``/model_info`` is gone: its process group is killed
  (if one is recorded) and its slot freed;
* JOINING workers are rolled back (stopped, slot freed): their admission never happened;
* a SWITCHING worker stays SWITCHING: the next plan's execution switches it (a switch
  checks the actual role first, so one that had completed is only re-admitted);
* LEAVING workers stay LEAVING and are deactivated by the orchestrator right after;
* an adopted worker's weight version is what it reports, not what was recorded (a push
  may have landed after the last record);
* an ACTIVE worker whose actual role differs from the record is stopped;
* an INACTIVE overlap process (released memory, kept for reuse) cannot prove that its
  memory is released, so it is stopped: process retention is traded for safety once.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from pearl_sglang.control.processes import kill_group
from pearl_sglang.core.events import Event, WeightsUpdated, WorkerLost, apply_all
from pearl_sglang.core.state import Activity, Role, StateTable, WorkerRecord
from pearl_sglang.workers.client import WorkerClient
from pearl_sglang.workers.errors import WorkerError

log = logging.getLogger("pearl.control")

_MODE_TO_ROLE = {"null": Role.COLOCATED, "prefill": Role.PREFILL, "decode": Role.DECODE}


@dataclass
class Reconciled:
    table: StateTable
    adopted: dict[int, int] = field(default_factory=dict)  # slot -> pid
    notes: list[str] = field(default_factory=list)


async def _probe(ops: WorkerClient, w: WorkerRecord) -> dict[str, Any] | None:
    if not w.endpoint:
        return None
    try:
        return await asyncio.wait_for(ops.model_info(w.endpoint), 10.0)
    except (WorkerError, asyncio.TimeoutError):
        return None


async def reconcile(table: StateTable, workers: dict[str, dict[str, Any]], ops: WorkerClient) -> Reconciled:
    out = Reconciled(table=table)
    events: list[Event] = []
    infos = await asyncio.gather(*(_probe(ops, w) for w in table.rollout_workers()))
    for w, info in zip(table.rollout_workers(), infos):
        pid = (workers.get(str(w.slot)) or {}).get("pid")

        def drop(reason: str) -> None:
            if pid:
                kill_group(pid)
            events.append(WorkerLost(w.slot))
            out.notes.append(f"slot {w.slot}: {reason}; stopped and freed")

        if info is None:
            drop("no answer from its endpoint")
            continue
        actual = _MODE_TO_ROLE.get(str(info.get("disaggregation_mode")), Role.COLOCATED)
        if w.activity is Activity.JOINING:
            drop("was joining (admission rolled back)")
        elif w.activity is Activity.INACTIVE:
            drop("retained overlap process whose memory release cannot be verified")
        elif w.activity is Activity.ACTIVE and actual is not w.role:
            drop(f"recorded {w.role.value} but is {actual.value}")
        else:
            if pid:
                out.adopted[w.slot] = pid
            actual_version = info.get("weight_version")
            if actual_version and actual_version != w.weight_version:
                events.append(WeightsUpdated((w.slot,), str(actual_version)))
                out.notes.append(f"slot {w.slot}: serves weights {actual_version}, not {w.weight_version}")
    known = {str(w.slot) for w in table.rollout_workers()}
    for slot, entry in workers.items():
        if slot not in known and entry.get("pid"):
            kill_group(entry["pid"])  # launched for a slot the table never admitted
            out.notes.append(f"slot {slot}: process without a table entry; stopped")
    if events:
        out.table = apply_all(table, events)
    for note in out.notes:
        log.warning("reconcile: %s", note)
    return out
