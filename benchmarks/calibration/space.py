"""What the calibration may change, within which range, on whose word.

Each parameter is a lever of the paper's regime that the reference notes
(``shared/reference/workload-and-hardware.md``) name with a plausible range; the fit
stays inside the ranges and says how far a fact is missed when they are not enough.
``apply`` turns a point of this space into the workload fields and the emulator profiles
a replay runs with.  Pure: no I/O (writing the profiles is the caller's).
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from pearl_sglang.emulator.profile import PerformanceModel, load_profile

ROOFLINE = {"qwen3-8b": "qwen3-8b-h800-tp2", "qwen3-30b-a3b": "qwen3-30b-a3b-h800-tp2"}
DECODE_EFFICIENCY = {"qwen3-8b": "decode_efficiency_8b", "qwen3-30b-a3b": "decode_efficiency_30b"}
# What the bundled (roofline-derived) profiles assume, per PROFILES.md: Qwen3-8B prefill at
# 600 of 989 TFLOP/s per GPU; decode reads weights and KV at 2.7 of 3.35 TB/s.
BUNDLED_PREFILL_EFFICIENCY = 600 / 989
BUNDLED_DECODE_EFFICIENCY = 2.7 / 3.35
ENV_P90_OVER_MEDIAN = 10.0     # the reference's lognormal: median ~1 s, p90 ~10 s
MAX_RESPONSE = 1536            # a Qwen3-8B OpenHands RL config's per-turn cap


@dataclass(frozen=True)
class Parameter:
    name: str
    low: float
    high: float
    source: str
    integer: bool = False

    def clip(self, x: float) -> float:
        x = min(max(x, self.low), self.high)
        return float(round(x)) if self.integer else x


SPACE: tuple[Parameter, ...] = (
    Parameter("response_tokens_mean", 150, 1536,
              "generated tokens per turn: ~150-400 without thinking, ~500-1,536 with it (Qwen3; a Qwen3-8B "
              "OpenHands RL config caps a turn at 1,536); drawn uniformly from 0.6x-1.4x the mean", integer=True),
    Parameter("turns_median", 16, 64,
              "turns per trajectory: dataset means 16.1 (R2E-Gym) to 64.3 (Qwen3-Coder on OpenHands)", integer=True),
    Parameter("turns_max", 30, 100, "turn cap of SWE RL setups: 30-100", integer=True),
    Parameter("env_latency_median_s", 0.5, 2.0,
              "environment latency per action: lognormal, median ~1 s (infrastructure alone 0.26-0.6 s), "
              "p90 10x the median"),
    Parameter("env_latency_cut_s", 60, 120,
              "the per-command time limit SWE scaffolds apply: commonly 60-120 s"),
    Parameter("rewrite_fraction", 0.0, 1.0,
              "share of the context re-prefilled per turn (chat templates dropping earlier reasoning, "
              "scaffolds truncating observations, cache misses): 0-1"),
    Parameter("prefill_efficiency", 0.30, 0.75,
              "long-context prefill's share of peak bf16 FLOP/s (989 TFLOP/s per GPU; the bundled 8B profile "
              "assumes 600 = 0.61; 30B-A3B keeps its MoE penalty relative to 8B)"),
    Parameter("decode_efficiency_8b", 0.30, 0.85,
              "Qwen3-8B decode's weight reads and per-iteration overheads as a share of HBM bandwidth "
              "(3.35 TB/s; bundled 2.7 = 0.81; scales the fixed and per-sequence decode terms); SGLang's CI "
              "floor for an 8B model at TP2 batch 1 (220 tok/s, 4.5 ms a token) is ~0.55 of roofline"),
    Parameter("decode_efficiency_30b", 0.30, 0.85,
              "Qwen3-30B-A3B decode's weight and expert reads, as for 8B; fused MoE kernels differ from dense "
              "ones, so the two models get their own (Figure 2b's ~400 tok/s per GPU pins this one)"),
    Parameter("decode_attention_efficiency", 0.25, 0.85,
              "decode attention's KV reads at long context as a share of HBM bandwidth (scales the "
              "per-context-token decode term of both models): paged 64-token KV pages at batch 1-16, "
              "split-KV reductions; an estimate (low confidence), bundled 0.81"),
)
BY_NAME = {p.name: p for p in SPACE}


def check(point: Mapping[str, float]) -> None:
    missing = set(BY_NAME) - set(point)
    if missing:
        raise ValueError(f"calibration point lacks {sorted(missing)}")
    for name, value in point.items():
        p = BY_NAME[name]
        if not p.low - 1e-9 <= value <= p.high + 1e-9:
            raise ValueError(f"{name}={value} outside its range [{p.low}, {p.high}]")


def workload_fields(point: Mapping[str, float]) -> dict[str, Any]:
    """The SweWorkload fields a point sets (the rest stay the preset's)."""
    m = point["response_tokens_mean"]
    median = point["env_latency_median_s"]
    return {
        "response_tokens": [max(1, round(0.6 * m)), min(MAX_RESPONSE, round(1.4 * m))],
        "turns_median": float(point["turns_median"]),
        "turns_max": int(point["turns_max"]),
        "env_latency_median_s": median,
        "env_latency_p90_s": median * ENV_P90_OVER_MEDIAN,
        "env_latency_cut_s": float(point["env_latency_cut_s"]),
        "rewrite_fraction": point["rewrite_fraction"],
    }


def profile(model: str, point: Mapping[str, float], *, name: str) -> PerformanceModel:
    """The roofline profile of ``model`` slowed (or sped up) to the point's efficiencies."""
    base = load_profile(ROOFLINE[model])
    p = BUNDLED_PREFILL_EFFICIENCY / point["prefill_efficiency"]
    d = BUNDLED_DECODE_EFFICIENCY / point[DECODE_EFFICIENCY[model]]
    a = BUNDLED_DECODE_EFFICIENCY / point["decode_attention_efficiency"]
    c = base.cost
    cost = type(c)(decode_fixed_s=c.decode_fixed_s * d, decode_per_seq_s=c.decode_per_seq_s * d,
                   decode_per_ctx_token_s=c.decode_per_ctx_token_s * a, prefill_fixed_s=c.prefill_fixed_s,
                   prefill_per_token_s=c.prefill_per_token_s * p, prefill_attn_s=c.prefill_attn_s * p,
                   moe_expert_per_seq_s=c.moe_expert_per_seq_s * d, moe_expert_max_s=c.moe_expert_max_s * d)
    return base.replace(name=name, cost=cost)


def profile_dict(profile_: PerformanceModel, model: str, point: Mapping[str, float]) -> dict[str, Any]:
    """A profile as its JSON file holds it, with a note on how it was derived."""
    doc = (f"{profile_.model}, {profile_.hardware}: the roofline profile {ROOFLINE[model]} with prefill at "
           f"{point['prefill_efficiency']:.3f} of peak FLOP/s, decode weight reads at "
           f"{point[DECODE_EFFICIENCY[model]]:.3f} and decode attention at "
           f"{point['decode_attention_efficiency']:.3f} of HBM bandwidth (fitted by benchmarks.calibrate; "
           f"PROFILES.md).")
    return {"_doc": doc, **asdict(profile_)}


def key(point: Mapping[str, float]) -> str:
    """A short stable name for a point (profile files, replay names)."""
    text = ",".join(f"{k}={point[k]:.6g}" for k in sorted(point))
    return hashlib.sha256(text.encode()).hexdigest()[:10]
