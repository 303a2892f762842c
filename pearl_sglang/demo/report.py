"""What the demo shows: a line per step, sampled roles over time, a summary and a plot."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl_rl_adapter import AsyncPearlClient, PearlError
from pearl_sglang.core.borrow_replay import ReplaySaving
from pearl_sglang.workload.results import StepResult
from pearl_sglang.workload.timebase import EmulatedTime


def roles(table: dict[str, Any]) -> dict[str, int]:
    """Active rollout workers by role and zone: ``P``, ``D``, ``C``, borrowed ``oP`` ..."""
    counts: dict[str, int] = {}
    for w in table["workers"]:
        if w["role"] == "training" or w["activity"] != "active":
            continue
        key = ("o" if w["zone"] == "overlap" else "") + w["role"][0].upper()
        counts[key] = counts.get(key, 0) + 1
    return counts


def label(counts: dict[str, int]) -> str:
    own = "".join(f"{counts[k]}{k}" for k in ("P", "D", "C") if counts.get(k))
    borrowed = "".join(f"{counts[k]}{k[1]}" for k in ("oP", "oD", "oC") if counts.get(k))
    return own + (f" +borrowed {borrowed}" if borrowed else "")


@dataclass
class Reporter:
    client: AsyncPearlClient
    time: EmulatedTime
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    last_state: dict[str, Any] = field(default_factory=dict)
    _t0: float = 0.0
    _seen_decisions: int = 0

    def start(self) -> None:
        self._t0 = self.time.now()

    def minutes(self) -> float:
        return (self.time.now() - self._t0) / 60

    async def sample_forever(self, every_s: float) -> None:
        while True:
            await self.sample()
            await self.time.wait(every_s)

    async def sample(self) -> None:
        try:
            state = await self.client.state()
        except PearlError:
            return
        self.last_state = state
        self.samples.append((self.minutes(), roles(state["table"])))

    async def on_step(self, result: StepResult) -> None:
        self.steps.append(result)
        await self.sample()
        counts = self.samples[-1][1] if self.samples else {}
        control = self.last_state.get("control") or {}
        decisions = control.get("decisions") or []
        print(f"[{self.minutes():6.1f} min] step {result.step:3d}  {result.duration_s:6.1f} s  "
              f"{result.throughput:8.0f} tok/s  turns {result.turns:5d}  errors {result.errors:3d}  "
              f"workers {label(counts):24s} borrowing {'yes' if control.get('borrowing') else 'no '}",
              flush=True)
        gate = control.get("gate") or {}
        last = (control.get("step_predictions") or [None])[-1]
        if last is not None:
            print(f"           makespan predicted {last['predicted_s']:8.1f} s  observed {last['observed_s']:8.1f} s  "
                  f"gate: toggle cost {gate.get('toggle_cost_s', 0.0):.2f} s (learned: "
                  f"{'yes' if gate.get('learned') else 'no'}), bias {gate.get('bias_s', 0.0):+.2f} s, "
                  f"explored {gate.get('explored', 0)} step(s)", flush=True)
            by_mode = (control.get("mode_correction") or {}).get("by_mode") or {}
            if by_mode:
                print("           observed/predicted by mode: " + ", ".join(
                    f"{mode} {e['factor']:.2f} ({e['steps']} step(s))" for mode, e in sorted(by_mode.items())),
                    flush=True)
        for d in decisions[-3:]:
            if d.get("operation") in ("train_begin", "train_finished", "gpus_join", "gpus_leave", "borrow_gate"):
                text = d.get("reason", "")
                choice = d.get("choice", {})
                what = f"{choice.get('prefill', 0)}P{choice.get('decode', 0)}D{choice.get('colocated', 0)}C" \
                    if choice else ("borrow" if d.get("borrow") else "no borrow")
                print(f"           {d['operation']:14s} -> {what:10s} {text[:110]}", flush=True)
                replay = d.get("replay")
                if replay and d.get("borrow"):
                    print(f"{'':29s} {ReplaySaving(**replay).describe()}", flush=True)

    def summary(self) -> dict[str, Any]:
        measured = self.steps[1:] or self.steps  # step 0 starts cold
        mean = sum(s.throughput for s in measured) / len(measured) if measured else 0.0
        control = self.last_state.get("control") or {}
        return {
            "steps": len(self.steps), "mean_throughput_tok_s": mean,
            "generated_tokens": sum(s.rollout_generated_tokens for s in self.steps),
            "training_tokens": sum(s.training_tokens for s in self.steps),
            "errors": sum(s.errors for s in self.steps),
            "failed_trajectories": sum(s.failed_trajectories for s in self.steps),
            "migrations": self.last_state.get("migrations"),
            "reconfiguration_phases": control.get("phases", {}),
            "gate": control.get("gate"),
            "step_predictions": control.get("step_predictions", []),
        }

    def write(self, out: Path, system: str) -> tuple[Path, Path]:
        summary = self.summary()
        data = {"system": system, "summary": summary,
                "steps": [{"step": s.step, "start_min": s.start / 60, "duration_s": s.duration_s,
                           "throughput": s.throughput, "generated": s.rollout_generated_tokens,
                           "training_tokens": s.training_tokens, "errors": s.errors} for s in self.steps],
                "roles": [{"min": t, **c} for t, c in self.samples]}
        path = out / "summary.json"
        path.write_text(json.dumps(data, indent=1))
        return path, self.plot(out / "throughput.png", system)

    def plot(self, path: Path, system: str) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        t0 = self.steps[0].start if self.steps else 0.0
        xs = [(s.end - t0) / 60 for s in self.steps]
        top.step(xs, [s.throughput for s in self.steps], where="pre", marker="o")
        top.set_ylabel("tokens/s per step")
        top.set_title(f"PEARL demo ({system}): throughput per step and rollout workers by role")
        keys = ["C", "P", "D", "oC", "oP", "oD"]
        names = {"C": "colocated", "P": "prefill", "D": "decode", "oC": "borrowed colocated",
                 "oP": "borrowed prefill", "oD": "borrowed decode"}
        ts = [t for t, _ in self.samples]
        stacks = [[c.get(k, 0) for _, c in self.samples] for k in keys]
        if ts:
            bottom.stackplot(ts, *stacks, labels=[names[k] for k in keys], step="post")
            bottom.legend(loc="upper left", fontsize=7, ncol=3)
        bottom.set_ylabel("active workers")
        bottom.set_xlabel("emulated minutes")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
