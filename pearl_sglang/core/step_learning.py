"""What the control plane learns from each finished rollout step, as one pure value.

A step runs from one ``train_begin`` to the next.  Each decision taken during it records
what both makespan models predict for the configuration it chose (``predicted``).  When
the step closes (``close``), its telemetry refits the profile (``ProfileTracker``) and
the per-turn spread (the tail-aware model's input), and its measured duration against
the configured model's last prediction teaches the borrowing gate (``LearningGate``:
toggle cost and bias) and the per-mode correction (``ModeCorrection``).  ``history``
keeps the last steps' predicted vs observed record that ``/pearl/state``, ``/metrics``
and the replays report.

No I/O and no clock: the shell passes the time of each event, in its own clock's
seconds, and the factor that turns them into the profile's seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from pearl_sglang.core.borrow_replay import StepTimeline
from pearl_sglang.core.errors import CoreError
from pearl_sglang.core.learning_gate import LearningGate
from pearl_sglang.core.mode_feedback import ModeCorrection
from pearl_sglang.core.pool_usage import PoolUsage
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.step_model import MakespanModel, StepContext, running_turns, step_predictions
from pearl_sglang.core.tail import TurnSpread, spread_of
from pearl_sglang.core.telemetry import ProfileTracker, StepTelemetry
from pearl_sglang.core.topology import Topology

HISTORY = 50  # finished steps kept in ``history``


@dataclass(frozen=True)
class StepPrediction:
    """Both models' prediction for the configuration the step runs, that configuration,
    and the profile they predicted with (the fitted symbols included)."""

    by_model: Mapping[str, float]
    topology: Topology
    profile: Profile


@dataclass(frozen=True)
class StepLearning:
    model: MakespanModel
    tracker: ProfileTracker
    gate: LearningGate
    modes: ModeCorrection
    time_scale: float = 1.0            # profile seconds per shell-clock second
    spread: TurnSpread | None = None   # per-turn spread of the last step (tail-aware model)
    started_at: float | None = None    # shell-clock time the step in progress began
    prediction: StepPrediction | None = None
    usage: PoolUsage | None = None     # what the last closed step's workers did (the gate's check)
    timeline: StepTimeline | None = None  # the last closed step's trajectories, if unborrowed (``core.borrow_replay``)
    history: tuple[Mapping[str, Any], ...] = ()

    def context(self, *, now: float | None = None, turns_done: tuple[int, ...] = (),
                profile: Profile | None = None) -> StepContext:
        """Where the step stands: a fresh batch when ``now`` is None or no step has begun;
        else the turns left of each trajectory and the time the step has run."""
        if now is None or self.started_at is None or profile is None:
            return StepContext(spread=self.spread)
        return StepContext(remaining=running_turns(turns_done, profile.B, profile.S), spread=self.spread,
                           elapsed_s=(now - self.started_at) * self.time_scale)

    def predicted(self, profile: Profile, topology: Topology, ctx: StepContext) -> "StepLearning":
        """A decision chose ``topology``: the step is now predicted on it."""
        return replace(self, prediction=StepPrediction(step_predictions(profile, topology, ctx), topology, profile))

    @property
    def predicted_s(self) -> float | None:
        """The configured model's prediction for the step in progress."""
        return None if self.prediction is None else self.prediction.by_model[self.model.value]

    def close(self, step: StepTelemetry, *, now: float, borrowed: bool, number: int | None,
              usage: PoolUsage | None = None, teaches_toggle_cost: bool = True,
              dedicated_workers: int = 0) -> tuple["StepLearning", str | None]:
        """Close the step in progress at ``now`` (``step``: its telemetry in profile
        seconds; ``number``: the trainer's step it fed; ``usage``: what its workers did;
        ``teaches_toggle_cost``: False for a step a gate check kept unborrowed,
        ``core.pool_usage``; ``dedicated_workers``: the ones that served it, for the
        replay of an unborrowed step, ``core.borrow_replay``).  Returns the new value and
        a warning when the telemetry did not fit (the fit is then left as it was)."""
        warning, tracker, spread = None, self.tracker, self.spread
        if step.turns:
            try:
                tracker, spread = tracker.observe(step), spread_of(step) or spread
            except CoreError as e:
                warning = f"telemetry did not fit: {e}"
        timeline = None if borrowed else StepTimeline.of(step, workers=dedicated_workers)
        nxt = replace(self, tracker=tracker, spread=spread, started_at=now, usage=usage, timeline=timeline)
        predicted = self.predicted_s
        if self.started_at is None or predicted is None:
            return nxt, warning
        observed = (now - self.started_at) * self.time_scale
        mode = self.prediction.topology.mode
        gate = self.gate.observe(borrowed=borrowed, observed_s=observed, predicted_s=predicted) \
            if teaches_toggle_cost else self.gate
        record = {"step": number, "borrowed": borrowed, "predicted_s": predicted, "observed_s": observed,
                  "mode": mode.value if mode else None, "corrected_s": predicted * self.modes.factor(mode),
                  "error": (observed - predicted) / observed if observed > 0 else None,
                  "makespan_model": self.model.value, "predicted_by_model_s": dict(self.prediction.by_model),
                  "profile": self.prediction.profile.to_dict()}
        return replace(nxt, gate=gate,
                       modes=self.modes.observe(mode, observed_s=observed, predicted_s=predicted),
                       history=(self.history + (record,))[-HISTORY:]), warning

    def describe(self) -> dict[str, Any]:
        return {"gate": {**self.gate.describe(), "pool_usage": None if self.usage is None else self.usage.to_dict()},
                "mode_correction": self.modes.describe(),
                "step_predictions": list(self.history[-10:])}
