"""Which background growth carries a caller's GPUs now, and the truthful answer about them.

Optional growth (an expansion after a join, a re-plan after a leave or a PD-mode change,
the growth after train_begin) runs in the background. The next join, leave, pd_mode call
or train_begin cancels it and begins a growth of its own, planned on the same table, so
the new plan carries the cancelled plan's GPUs too. A caller that waits for its GPUs
therefore follows this chain to the growth that finishes, and its answer is read from
the table at that moment: which workers on its GPUs serve, not which slots one growth of
the chain happened to add. ``join_answer`` is pure; the orchestrator does the waiting.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from pearl_sglang.core.state import ARRIVING_ACTIVITIES, Activity, Role, StateTable


@dataclass(frozen=True)
class Growth:
    """What a background growth admitted, or why it stopped short of its target;
    ``waves``: the waves of a staged colocated <-> PD change, in order (core/waves.py)."""

    admitted: tuple[int, ...] = ()
    reason: str | None = None
    waves: tuple[dict[str, Any], ...] = ()


@dataclass(eq=False)
class Expansion:
    """One background growth, numbered in start order. ``superseded_by`` names the event
    that cancelled it; it stays None for a growth that finished on its own."""

    number: int
    operation: str
    task: asyncio.Task
    superseded_by: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The end of a chain of growths: the last one, what it did (None when it was
    cancelled and nothing took over, i.e. at shutdown) and the events that superseded
    the earlier ones, in order."""

    expansion: int
    growth: Growth | None
    superseded_by: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"expansion": self.expansion, "superseded_by": list(self.superseded_by)}

    def stopped(self) -> str:
        """Why a chain ended with no growth that finished."""
        last = self.superseded_by[-1] if self.superseded_by else "cancelled"
        if last == "shutdown":
            return "the control plane shut down before the growth finished"
        return f"{last} stopped the growth and began none in its place"


def readied_on(table: StateTable, gpus: frozenset[str]) -> tuple[int, ...]:
    """Slots of the rollout workers on any of ``gpus`` that are still being made ready."""
    return tuple(w.slot for w in table.rollout_workers()
                 if gpus & set(w.gpus) and w.activity in ARRIVING_ACTIVITIES)


def left_unknown(table: StateTable) -> list[int]:
    """Workers that a cancelled growth leaves in a state nobody knows: those it was
    launching, and those it was relaunching in a new role (colocated <-> PD), whose
    process may be stopped or replaced by one the table does not know. They are
    cancelled like a failed group; the next plan launches them again. In-place
    prefill <-> decode switches are left alone: the next growth asks the worker its role."""
    def relaunching(w) -> bool:
        return (w.activity is Activity.SWITCHING and not w.held and w.pending_role is not None
                and {w.role, w.pending_role} != {Role.PREFILL, Role.DECODE})
    return [w.slot for w in table.rollout_workers() if w.activity is Activity.JOINING or relaunching(w)]


def join_answer(table: StateTable, gpus: tuple[str, ...], outcome: Outcome) -> dict[str, Any]:
    """What happened to the joined GPUs once their chain of growths ended.

    ``admitted``: the serving workers on them. ``cancelled``: none serves because the
    growth that carried them failed, they left first, or the control plane shut down
    (``reason`` says which). A join that neither serves nor was cancelled is one the
    decision did not need (``reason`` says so); its GPUs stay in the budget either way."""
    wanted = frozenset(gpus)
    admitted = sorted(w.slot for w in table.rollout_workers()
                      if wanted & set(w.gpus) and w.activity is Activity.ACTIVE)
    answer: dict[str, Any] = {"action": "join", "admitted": admitted, "cancelled": False, **outcome.describe()}
    if admitted:
        return answer
    gone = sorted(wanted - table.dedicated_gpus)
    if gone:
        return {**answer, "cancelled": True, "reason": f"GPUs {gone} left before their workers were admitted"}
    if outcome.growth is None:
        return {**answer, "cancelled": True, "reason": f"{outcome.stopped()}; the GPUs stay in the budget"}
    if outcome.growth.reason:
        return {**answer, "cancelled": True,
                "reason": f"{outcome.growth.reason}; the GPUs stay in the budget and the next event re-plans"}
    return {**answer, "reason": "the current decision does not use them; the GPUs stay in the budget"}


async def follow(growth: Expansion, *, lock: asyncio.Lock, current: Callable[[], Expansion | None],
                 still_joining: Callable[[], bool] = lambda: False) -> Outcome:
    """Wait for ``growth`` and, each time an event cancelled it, for the growth that event
    began instead (``current()`` once ``lock`` is free: events cancel and begin under
    it), until one finishes. Then, while ``still_joining()``, also for a newer growth
    still in flight, which an event began after this one had already finished."""
    superseded: list[str] = []
    while True:
        await asyncio.wait([growth.task])
        if growth.task.cancelled():
            superseded.append(growth.superseded_by or "cancelled")
            async with lock:
                successor = current()
            if successor is None or successor is growth:
                return Outcome(growth.number, None, tuple(superseded))
            growth = successor
            continue
        result = growth.task.result()
        newer = current()
        if newer is not None and newer is not growth and not newer.task.done() and still_joining():
            growth = newer
            continue
        return Outcome(growth.number, result, tuple(superseded))
