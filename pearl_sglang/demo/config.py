"""What the demo runs: the paper's cluster shape by default, scaled in time."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

from pearl_sglang.emulator.profile import load_profile
from pearl_sglang.workload.presets import DEFAULT_PRESET, available_presets, load_preset

SYSTEMS = ("pearl", "rlboost", "roll")


@dataclass(frozen=True)
class DemoConfig:
    """``system``: pearl (PD-adaptive, borrows training GPUs, follows the trace), rlboost
    (colocated, follows the trace, never borrows) or roll (colocated, dedicated GPUs only)."""

    system: str = "pearl"
    minutes: float = 60.0          # emulated minutes of the preemptible trace to replay
    trace_start_h: float = 1.0     # where in the Bamboo p3 trace the segment starts
    time_scale: float = 60.0       # emulated seconds per real second
    batch_size: int = 32
    group_size: int = 8
    dedicated_workers: int = 2     # TP2 workers on reserved rollout GPUs
    max_preemptible_workers: int = 6
    overlap_workers: int = 8       # TP2 workers that may borrow the 16 training GPUs
    # Emulated seconds of one training step on the 16 training GPUs: the paper's 163.8 s on
    # 8 GPUs (section 3.1) split over 16 (linear scaling at a fixed batch, an optimistic bound).
    train_step_s: float = 163.8 * 8 / 16
    preset: str = DEFAULT_PRESET   # workload regime and worker profile (pearl_sglang/workload/presets)
    profile: str = ""              # emulated worker profile; empty: the preset's Qwen3-8B profile
    seed: int = 0
    # Partial-rollout carry-over: end each rollout once this share of the batch finished and
    # resume the rest first in the next step (0: off, every step waits for its whole batch).
    carry_over_share: float = 0.0
    out: str = "runs/demo"
    port: int = 0

    def validate(self) -> None:
        if self.system not in SYSTEMS:
            raise ValueError(f"--system must be one of {SYSTEMS}")
        for name in ("minutes", "time_scale", "train_step_s"):
            if not 0 < getattr(self, name) < math.inf:  # NaN too
                raise ValueError(f"--{name.replace('_', '-')} must be a positive finite number")
        if not 0 <= self.trace_start_h < math.inf:
            raise ValueError("--trace-start-h must be a finite number of hours >= 0")
        if self.max_preemptible_workers < 0 or self.overlap_workers < 0:
            raise ValueError("--max-preemptible-workers and --overlap-workers must be >= 0")
        if not 0 <= self.port <= 65535:
            raise ValueError("--port must be in [0, 65535] (0: a free port)")
        if self.batch_size < 1 or self.group_size < 1 or self.batch_size % self.group_size:
            raise ValueError("--batch-size must be a positive multiple of --group-size")
        if self.dedicated_workers < 1:
            raise ValueError("--dedicated-workers must be >= 1")
        if not 0 <= self.carry_over_share <= 1:
            raise ValueError("--carry-over-share must be in [0, 1] (0: off)")
        if self.preset not in available_presets():
            raise ValueError(f"--preset must be one of {available_presets()}")
        if self.profile:
            load_profile(self.profile)  # ProfileError (a ValueError) names the bundled ones

    @property
    def worker_profile(self) -> str:
        return self.profile or load_preset(self.preset).profile_for("qwen3-8b")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in fields(DemoConfig):
            flag = "--" + f.name.replace("_", "-")
            if f.name == "system":
                parser.add_argument(flag, default=f.default, choices=SYSTEMS, help=DemoConfig.__doc__)
            elif f.name == "preset":
                parser.add_argument(flag, default=f.default, choices=available_presets(),
                                    help="swe-paper: fitted to the paper's section 3 measurements; "
                                         "env-bound: the environment-latency-bound regime")
            else:
                parser.add_argument(flag, type=type(f.default), default=f.default)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "DemoConfig":
        config = cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
        config.validate()
        return config
