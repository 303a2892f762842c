"""Stragglers first on the data path: which placement a named trajectory's turn gets.

``--straggler-isolation`` turns the step's tail over to its predicted stragglers: once
``--straggler-tail-share`` of the step's trajectories look finished (telemetry's
liveness), a straggler's turn leaves its worker for a clearly less contended one and the
other turns pay for sharing a worker with stragglers (``core.straggler_isolation``). Before the tail,
or for a request that names no trajectory, placement is the routing policy's own; with
``--straggler-isolation-scope borrowed`` also while no lent training GPU serves rollout.
"""
from __future__ import annotations

from typing import Callable

from pearl_sglang.core.state import StateTable, Zone
from pearl_sglang.core.straggler_isolation import Isolation, IsolationConfig
from pearl_sglang.router.telemetry import TelemetryCollector

IsolationFor = Callable[[str | None, float], Isolation | None]


def no_isolation(trajectory: str | None, now: float) -> None:
    return None


def borrowed_serving(table: Callable[[], StateTable]) -> Callable[[], bool]:
    """Whether a worker on training GPUs lent to rollout (zone OVERLAP) serves now: the
    capacity that arrives for the step's tail. Read once per table (tables are immutable)."""
    last: StateTable | None = None
    lent = False

    def serving() -> bool:
        nonlocal last, lent
        t = table()
        if t is not last:
            last, lent = t, any(w.zone is Zone.OVERLAP for w in t.active())
        return lent
    return serving


def isolation_for(telemetry: TelemetryCollector, *, share: float, config: IsolationConfig,
                  when: Callable[[], bool] | None = None) -> IsolationFor:
    """``when``: isolate only while it holds (``borrowed_serving``); None: always."""
    config.validate()

    def isolation(trajectory: str | None, now: float) -> Isolation | None:
        if trajectory is None or (when is not None and not when()):
            return None
        view = telemetry.tail(now, share=share)
        if view.finished_share < config.tail_share or not view.stragglers:
            return None
        return Isolation(straggler=trajectory in view.stragglers, stragglers_on=view.stragglers_on,
                         weight=config.weight, home_margin=config.home_margin)
    return isolation
