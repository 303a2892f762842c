"""What the control plane needs from the data path, stated by the control plane.

A reconfiguration takes a worker out of routing in the state table, then asks the data
path to move that worker's requests elsewhere; it admits a group of ready workers under a
brief admission pause; it keeps health probes from counting a planned pause (a weight
push) as failures; and at each step boundary it takes the step's records to fit the
profile. The router implements this port (``router.data_plane``); the composition root
hands it to the executor, so neither package imports the other.
"""
from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Iterable, Protocol

from pearl_sglang.core.telemetry import StepTelemetry


class DataPlane(Protocol):
    async def drain(self, slot: int, deadline_s: float) -> bool:
        """Move every request on ``slot`` to other workers with its partial output kept;
        False if some were still there at the deadline (the caller then stops the worker
        anyway: a GPU is never reported free while a request may hold memory on it)."""

    def admission_paused(self, reason: str) -> AbstractAsyncContextManager[None]:
        """New requests wait while the block runs, so none reaches a half-admitted group."""

    def planned_pause(self, slots: Iterable[int]) -> AbstractContextManager[None]:
        """These workers are paused on purpose while the block runs: failed health probes
        do not count against them."""

    def process_replaced(self, slot: int) -> None:
        """``slot`` now runs a new or restarted process: failures counted against the one it
        replaced say nothing about it."""

    def close_step(self) -> StepTelemetry:
        """The rollout step ended: its per-request records and each worker's busy time,
        handed over once (the next step starts empty)."""

    def turns_done(self, now: float) -> list[int]:
        """Turns each trajectory still running at ``now`` has finished."""
