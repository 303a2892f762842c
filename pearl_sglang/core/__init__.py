"""Pure core of PEARL: state table, cost models, decision engine, planner, gate, fitting.

Nothing here performs I/O, reads a clock or imports asyncio/aiohttp; the control plane
calls these functions with snapshots and carries out the effects.  Layout:

* ``state``, ``events``: the GPU-worker-role table, its invariants and its updates.
* ``topology``, ``profile``, ``makespan``: shapes, paper symbols, equations (1)-(3).
* ``decision``: candidate enumeration, feasibility, hysteresis.
* ``planner``: minimal-change plans, equations (5)-(6).
* ``gate``: borrowing gate, equation (7), and the online toggle-cost estimate.
* ``telemetry``: profile fitting from per-request records.
* ``policy``: the target topology under the PD mode, and the borrow decision.
* ``control``: the control core, ``on_event(state, event, seen) -> (state, effects)``
  over the frozen ``ControlState`` (training, borrowing, steps, learning, pushes).
"""
from pearl_sglang.core.decision import Decision, Reason, Thresholds, best_makespan, decide, enumerate_candidates
from pearl_sglang.core.errors import (
    CoreError,
    InfeasibleTarget,
    InvalidConfig,
    InvalidProfile,
    InvalidSnapshot,
    InvalidTransition,
    InvariantViolation,
    UnknownWorker,
)
from pearl_sglang.core.events import apply, apply_all
from pearl_sglang.core.gate import GateDecision, ToggleCostEstimator, borrow_gate, gate_for_profile
from pearl_sglang.core.makespan import Candidate, Constraints
from pearl_sglang.core.planner import ChangeCosts, Plan, plan
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone
from pearl_sglang.core.telemetry import ProfileTracker, StaticFacts, StepTelemetry
from pearl_sglang.core.topology import Mode, Topology

__all__ = [
    "Activity", "Candidate", "ChangeCosts", "Constraints", "CoreError", "Decision", "GateDecision",
    "InfeasibleTarget", "InvalidConfig", "InvalidProfile", "InvalidSnapshot", "InvalidTransition",
    "InvariantViolation", "Mode", "OverlapOwner", "Plan", "Profile", "ProfileTracker", "Reason", "Role",
    "StateTable", "StaticFacts", "StepTelemetry", "Thresholds", "ToggleCostEstimator", "Topology",
    "UnknownWorker", "WorkerRecord", "Zone", "apply", "apply_all", "best_makespan", "borrow_gate", "decide",
    "enumerate_candidates", "gate_for_profile", "plan",
]
