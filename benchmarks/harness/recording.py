"""What a replay records: per step, the router's utilization, the control plane's latest
choice and prediction, each trajectory's time in requests and in its environment, and the
partial-rollout carry-over; and the summary over the steps of the window."""
from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any

from pearl_rl_adapter import AsyncPearlClient
from pearl_sglang.core.prediction_error import mape, mape_by_model, new_prediction
from pearl_sglang.demo.report import label, roles
from pearl_sglang.workload.results import StepResult


@dataclass
class Recorder:
    client: AsyncPearlClient
    t0: float
    window_s: float
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    last_state: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    _predicted_steps: set = field(default_factory=set)

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def sample(self) -> dict[str, int]:
        with contextlib.suppress(Exception):
            self.last_state = await self.client.state()
        counts = roles(self.last_state["table"]) if self.last_state else {}
        # The router's predicted stragglers now (its critical path, at its straggler share)
        # and how many trajectories it counts as running: how good its prediction was is
        # read against the step's finish order afterwards.
        path = self.last_state.get("critical_path") or {}
        self.samples.append({"t_s": self.now(), **counts, "running": path.get("running", 0),
                             "stragglers": [e["trajectory"] for e in path.get("stragglers") or []]})
        return counts

    async def sample_forever(self, every_s: float) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(every_s)

    async def on_step(self, r: StepResult) -> None:
        counts = await self.sample()
        control = self.last_state.get("control") or {}
        decisions = control.get("decisions") or []
        choice = next((d.get("choice") for d in reversed(decisions) if d.get("choice")), None)
        gate = next((d for d in reversed(decisions) if d.get("operation") == "borrow_gate"), None)
        row = {
            "step": r.step, "start_s": r.start - self.t0, "end_s": r.end - self.t0,
            "duration_s": r.duration_s, "throughput": r.throughput,
            "generated_tokens": r.rollout_generated_tokens, "training_tokens": r.training_tokens,
            "rollout_s": r.rollout_end - r.rollout_start, "train_s": r.train_end - r.train_start,
            "turns": r.turns, "errors": r.errors, "failed_trajectories": r.failed_trajectories,
            "error_samples": list(r.error_samples[:2]),
            "topology": label(counts), "roles": counts, "borrowing": bool(control.get("borrowing")),
            "last_choice": choice, "in_window": r.end - self.t0 <= self.window_s + 1e-6,
            # The borrowing gate's last call: its answer, why, what the workers of the step
            # before it did (core.pool_usage) and that step replayed with the overlap
            # workers (core.borrow_replay).
            "gate": None if gate is None else {k: gate.get(k) for k in ("borrow", "reason", "benefit_s",
                                                                        "toggle_cost_s", "pool_usage", "replay")},
            # The router's per-worker utilization of this step's rollout (closed at train_begin).
            "utilization": (self.last_state.get("utilization") or {}).get("last_step"),
            # The control plane's predictions of this rollout (closed at this step's train_begin,
            # when the batch was complete) for the configuration that ran, by each makespan
            # model, with the measured rollout time they predict; None when none closed since.
            "prediction": new_prediction(control.get("step_predictions") or [], self._predicted_steps),
            # Per trajectory of the batch: [id, turns, seconds in requests, seconds in the environment].
            "trajectories": trajectory_times(r),
            # Partial-rollout carry-over: trajectories resumed into this batch and left out of it,
            # and the batch's generated tokens by the policy version that generated them.
            "carried_in": list(r.carried_in), "carried_out": list(r.carried_out),
            "carried_out_generated_tokens": r.carried_out_generated_tokens,
            "weight_version": r.weight_version, "tokens_by_policy": tokens_by_policy(r),
        }
        if row["prediction"] is not None:
            row["prediction"]["rollout_s"] = row["rollout_s"]
        self.steps.append(row)
        if self.verbose:
            print(f"[{row['end_s'] / 60:6.1f} min] step {r.step:3d} {r.duration_s:7.1f} s "
                  f"{r.throughput:8.0f} tok/s errors {r.errors:3d} {row['topology']:26s} "
                  f"borrowing {'yes' if row['borrowing'] else 'no'}", file=sys.stderr, flush=True)


def trajectory_times(r: StepResult) -> list[list[Any]]:
    """What each trajectory of a step spent in requests (queueing, prefill, decode) and in
    its environment, from the driver's per-turn telemetry: where a step's tail comes from."""
    per: dict[str, list[Any]] = {}
    for t in r.telemetry:
        row = per.setdefault(t.trajectory_id, [t.trajectory_id, 0, 0.0, 0.0])
        row[1] += 1
        row[2] += t.request_s
        row[3] += t.env_time_s
    return [[tid, n, round(req, 3), round(env, 3)] for tid, n, req, env in per.values()]


def tokens_by_policy(r: StepResult) -> dict[str, int]:
    """Generated tokens of a step's batch by the policy version that generated them."""
    out: dict[str, int] = {}
    for t in r.telemetry:
        out[t.policy_version] = out.get(t.policy_version, 0) + t.generated_tokens
    return out


def summarize(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean throughput over in-window steps after the first (step 0 starts cold), the
    time-weighted mean (total tokens / total time) over the same steps, and the rollout
    throughput (generated tokens / rollout seconds) that fixed-resource experiments compare."""
    measured = [s for s in steps[1:] if s["in_window"]] or steps[1:] or steps
    tokens = sum(s["generated_tokens"] + s["training_tokens"] for s in measured)
    balance = [u["busy_busiest_over_mean"] for s in measured
               if (u := s.get("utilization")) and u.get("busy_busiest_over_mean") is not None]
    duration = sum(s["duration_s"] for s in measured)
    rollout_s = sum(s["rollout_s"] for s in measured)
    return {
        "steps": len(steps), "measured_steps": len(measured),
        "mean_throughput_tok_s": sum(s["throughput"] for s in measured) / len(measured) if measured else 0.0,
        "token_weighted_throughput_tok_s": tokens / duration if duration > 0 else 0.0,
        "rollout_throughput_tok_s": sum(s["generated_tokens"] for s in measured) / rollout_s if rollout_s > 0 else 0.0,
        "mean_step_s": duration / len(measured) if measured else 0.0,
        "errors": sum(s["errors"] for s in steps),
        "failed_trajectories": sum(s["failed_trajectories"] for s in steps),
        # Busiest worker's busy time over the mean, per step: an idle part of the pool shows here.
        "busy_busiest_over_mean_max": max(balance) if balance else None,
        "busy_busiest_over_mean_mean": sum(balance) / len(balance) if balance else None,
        # Mean absolute percentage error of the configured makespan model's prediction against the
        # measured rollout time over every recorded step, and of each model's.
        "prediction_mape": mape((p["predicted_s"], p["rollout_s"]) for s in steps if (p := s.get("prediction"))),
        "prediction_mape_by_model": mape_by_model(p for s in steps if (p := s.get("prediction"))),
        "predicted_steps": sum(1 for s in steps if s.get("prediction")),
    }
