"""What the control core decides at each event: a target topology under the configured
PD mode, and whether to borrow the training GPUs. No I/O; ``core.control`` records the
answers and the shell acts on them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from pearl_sglang.core.borrow_replay import ReplaySaving, StepTimeline, replay_guard, replay_saving
from pearl_sglang.core.decision import Decision, Thresholds, decide
from pearl_sglang.core.gate import GateDecision
from pearl_sglang.core.mode_feedback import ModeCorrection
from pearl_sglang.core.pd_mode import AUTO, PdMode
from pearl_sglang.core.pool_usage import PoolUsage, UsageThresholds, usage_guard
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.telemetry import ProfileFit, ProfileTracker, fitted_symbols
from pearl_sglang.core.step_model import MakespanModel, StepContext, candidates, gate as model_gate
from pearl_sglang.core.state import StateTable
from pearl_sglang.core.topology import Topology


@dataclass(frozen=True)
class DecisionConfig:
    """What decisions depend on, from the cluster configuration (``ClusterConfig.decisions``):
    the configured profile and which of its symbols telemetry refits, the PD mode (an
    operator may override it), the makespan model, the hysteresis thresholds, and the
    borrowing gate (``borrow`` false: never; ``gated`` false: whenever the GPUs are idle;
    ``usage``: the pool-usage check; ``replay_check``: the replay of the last unborrowed
    step, ``core.borrow_replay``)."""

    profile: Profile
    pd_mode: PdMode = PdMode(AUTO)
    makespan_model: str = "paper"
    profile_fit: str = "all"
    thresholds: Thresholds = field(default_factory=Thresholds)
    borrow: bool = True
    gated: bool = True
    usage: UsageThresholds = field(default_factory=UsageThresholds)
    replay_check: bool = True

    def fitted(self, tracker: ProfileTracker) -> Profile:
        """The configured profile with the symbols telemetry has identified replaced (all,
        or the workload's alone: ``profile_fit``)."""
        return replace(self.profile, **fitted_symbols(tracker.estimate, ProfileFit(self.profile_fit)))


def target_topology(config: DecisionConfig, table: StateTable, profile: Profile, budget: int,
                    ctx: StepContext = StepContext(), correction: ModeCorrection | None = None) -> Decision:
    """``pd_mode`` "auto" is the decision engine's choice (with hysteresis against the
    table's topology); "colocated" and "disaggregated" pin the mode (the baselines and the
    forced-PD ablation), and "P:D" pins the ratio, scaled to the budget (with at least one
    of each); the engine's candidates stay in the record. The candidates are predicted by
    ``config.makespan_model`` on where the step stands (``ctx``), then scaled by what each
    mode delivered so far (``correction``, ``core.mode_feedback``)."""
    current = table.topology()
    model = MakespanModel.parse(config.makespan_model)
    cands = candidates(model, profile, budget, ctx)
    if correction is not None:
        cands = correction.apply(cands)
    decision = decide(profile, budget=budget, current=current if current.total else None,
                      thresholds=config.thresholds, candidates=cands)
    mode = config.pd_mode
    ratio = mode.ratio
    if ratio is not None and budget >= 2:
        prefill = min(max(round(budget * ratio[0] / sum(ratio)), 1), budget - 1)
        return replace(decision, choice=Topology.pd(prefill, budget - prefill), reason=f"pd_mode={mode}")
    if mode == "colocated" or (mode != "auto" and budget < 2):
        return replace(decision, choice=Topology(0, 0, budget), reason=f"pd_mode={mode}")
    if mode == "disaggregated":
        pd = [c for c in decision.candidates if not c.topology.colocated]
        # Forced PD: the best feasible ratio, else the best ratio at all.
        best = min(pd, key=lambda c: (not c.feasible, c.predicted_makespan_s))
        if best.topology != decision.choice:
            return replace(decision, choice=best.topology, reason=f"pd_mode={mode}: best ratio")
    return decision


def replayed(config: DecisionConfig, table: StateTable, profile: Profile, timeline: StepTimeline | None, *,
             join_after_s: float) -> ReplaySaving | None:
    """The last unborrowed step replayed with the overlap workers serving from
    ``join_after_s`` (``core.borrow_replay``); None when the check is off or there is
    nothing to replay."""
    if not config.replay_check or timeline is None or not table.overlap_gpus:
        return None
    overlap = table.budget(table.available_gpus()) - table.budget(frozenset(table.dedicated_gpus))
    return replay_saving(timeline, join_after_s=join_after_s, A=profile.A, b=profile.b,
                         overlap_workers=max(overlap, 0))


def borrow(config: DecisionConfig, table: StateTable, profile: Profile, *, toggle_cost_s: float,
           remaining: float | None, ctx: StepContext = StepContext(), usage: PoolUsage | None = None,
           replay: ReplaySaving | None = None) -> tuple[bool, str, GateDecision | None]:
    """Equation (7) on the current budgets under ``config.makespan_model``, checked against
    what the last step's workers did (``usage``, ``core.pool_usage``) and against the last
    unborrowed step replayed with the overlap workers (``replay``,
    ``core.borrow_replay``), unless borrowing is off or ungated."""
    if not config.borrow or not table.overlap_gpus:
        return False, "borrowing disabled" if not config.borrow else "no overlap GPUs", None
    if not config.gated:
        return True, "ungated borrowing", None
    ded = table.budget(frozenset(table.dedicated_gpus))
    full = table.budget(table.available_gpus())
    r = profile.B if remaining is None else min(max(remaining, 0.0), profile.B)
    decision = model_gate(MakespanModel.parse(config.makespan_model), profile, dedicated_workers=max(ded, 1),
                          overlap_workers=full - ded, remaining=r, ctx=ctx, toggle_cost_s=toggle_cost_s)
    decision = replay_guard(usage_guard(decision, usage, config.usage), replay)
    return decision.borrow, decision.reason, decision
