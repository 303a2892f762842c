"""Workers an RL framework started and registered (sglang-router's worker API): which
they are, and what PEARL may not do to them because it cannot relaunch them.

Pure facts over the state table, read by the control plane (planning, execution) and by
the router (``/pearl/state``) alike. A registered worker's GPU ids carry ``GPU_PREFIX``.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl_sglang.core.pd_mode import AUTO, COLOCATED, DISAGGREGATED, PdMode
from pearl_sglang.core.state import Role, StateTable, WorkerRecord

GPU_PREFIX = "registered"


@dataclass(frozen=True)
class RegistrationConfig:
    startup_timeout_s: float = 600.0  # sglang-router's --worker-startup-timeout-secs
    poll_interval_s: float = 1.0
    drain_timeout_s: float = 60.0

    def validate(self) -> None:
        if not (self.startup_timeout_s > 0 and self.poll_interval_s > 0 and self.drain_timeout_s > 0):
            raise ValueError("registration timeouts and the poll interval must be positive")


def is_registered(w: WorkerRecord) -> bool:
    return all(g.startswith(f"{GPU_PREFIX}-") for g in w.gpus)


@dataclass(frozen=True)
class ModeLock:
    """The PD mode the decision engine is held to, and why."""

    pd_mode: PdMode
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"pd_mode": self.pd_mode, "reason": self.reason}


def relaunch_lock(table: StateTable) -> ModeLock | None:
    """Registered workers were launched by the framework, so PEARL cannot relaunch them:
    colocated <-> PD changes are taken out of the candidates and the mode stays that of
    the registered workers (prefill <-> decode switches and borrowing stay in place).
    Pure: no I/O."""
    registered = [w for w in table.rollout_workers() if is_registered(w)]
    if not registered:
        return None
    pd = any(w.intended_role in (Role.PREFILL, Role.DECODE) for w in registered)
    mode = PdMode(DISAGGREGATED if pd else COLOCATED)
    return ModeLock(pd_mode=mode, reason=f"{len(registered)} registered worker(s) cannot be relaunched: "
                                         f"colocated <-> PD changes are excluded, the mode stays {mode}")


def locked_pd_mode(configured: PdMode, lock: ModeLock | None) -> PdMode:
    """The configured PD mode, unless it would need relaunching registered workers."""
    if lock is None:
        return configured
    if lock.pd_mode == COLOCATED:
        return lock.pd_mode
    return configured if configured not in (AUTO, COLOCATED) else PdMode(DISAGGREGATED)
