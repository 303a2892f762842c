"""A state table for pre-launched workers (attach mode).

PEARL did not start these workers, so it cannot relaunch them: their GPUs are opaque ids
(``attached-<slot>:<i>``), they live in the dedicated zone, and ratio changes can only be
made in place through ``/pd_role_switch``.
"""
from __future__ import annotations

from pearl_sglang.core.state import Activity, Role, StateTable, WorkerRecord, Zone


def attached_table(*, regular: tuple[str, ...] = (), prefill: tuple[tuple[str, int], ...] = (),
                   decode: tuple[str, ...] = (), tp_size: int = 1) -> StateTable:
    entries: list[tuple[Role, str, int | None]] = (
        [(Role.COLOCATED, url, None) for url in regular]
        + [(Role.PREFILL, url, port) for url, port in prefill]
        + [(Role.DECODE, url, None) for url in decode])
    workers, gpus = [], []
    for slot, (role, url, port) in enumerate(entries):
        ids = tuple(f"attached-{slot}:{i}" for i in range(tp_size))
        gpus.extend(ids)
        workers.append(WorkerRecord(slot=slot, gpus=ids, zone=Zone.DEDICATED, role=role,
                                    activity=Activity.ACTIVE, endpoint=url.rstrip("/"), bootstrap_port=port))
    return StateTable.create(tp_size=tp_size, dedicated_gpus=gpus, workers=workers)
