"""Starting profiles for the paper's setup (Qwen3-8B, TP2 workers on H800-class GPUs).

Every number is derived from public facts (model config, datasheets, the SWE workload
statistics of the reference notes); telemetry replaces the workload symbols after the
first rollout step. Used by docs/decisions_table.py and as the demo's initial profile.
"""
from __future__ import annotations

from pearl_sglang.core.profile import Profile

GIB = 2**30

# Qwen3-8B, TP2 workers on H800-80GB (H100 compute, 3.35 TB/s HBM), 800 Gb/s IB.
KV_PER_TOKEN = 2 * 36 * 8 * 128 * 2          # 147,456 B (K and V, 36 layers, 8 KV heads, dim 128, bf16)
MAX_TRAJECTORY = 32 * 1024                   # tokens (paper's cap)
WEIGHTS = 16.4e9                             # bf16 weights, B
WORKER_HBM = 2 * 80e9                        # TP2
MEM_FRACTION = 0.85                          # SGLang static memory fraction (weights + KV)
TURNS = 30                                   # turn cap of a Qwen3-8B OpenHands RL config
GENERATED = 300                              # tokens per turn, thinking off (150-400)
NEW_PER_TURN = 1000                          # observation ~700 + carried response ~300
ENV_MEAN = 5.0                               # s; lognormal median 1 s, p90 10 s -> mean ~5 s
MEAN_CONTEXT = 16 * 1024                     # tokens, half the cap
PREFILL_TOK_S_PER_GPU = 25_000               # ~30K at 8K context, ~20K at 24K
TP_EFFICIENCY = 0.9

A = 0.0024 + 0.0021                          # weight reads + communication/dispatch, s
b = MEAN_CONTEXT * (KV_PER_TOKEN / 2) / 3.35e12   # per-GPU KV bytes of one sequence / HBM BW
t_prefill = 1 / (2 * PREFILL_TOK_S_PER_GPU * TP_EFFICIENCY)
decode_turn = GENERATED * (A + b * 64 / 3)   # ~3.6 s at ~21 concurrent sequences
theta = ENV_MEAN / decode_turn               # env time per unit of decode time

COMMON = dict(
    B=64, S=TURNS, r=GENERATED, theta=round(theta, 3), A=A, b=b, t_prefill=t_prefill,
    K=KV_PER_TOKEN, BW=0.84 * 100e9,         # Mooncake reached ~84% of a NIC's raw rate
    T_over=0.2,                              # assumption: per-turn PD switching overhead
    T_env=TURNS * ENV_MEAN,
    K_seq=MAX_TRAJECTORY * KV_PER_TOKEN,     # 4.5 GiB
    H_max=WORKER_HBM * MEM_FRACTION - WEIGHTS,
)


def qwen3_8b_tp2(*, delta_L: float = NEW_PER_TURN, B: int = 64) -> Profile:
    """The cache-friendly regime by default; ``delta_L = 30 * r`` is the prefill-heavy one."""
    return Profile(delta_L=delta_L, **{**COMMON, "B": B})
