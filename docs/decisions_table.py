"""Generate the decision tables in docs/decisions.md from the real decision engine.

Run: ``python docs/decisions_table.py`` (prints Markdown).  Every input is derived below
from /work/shared/reference/workload-and-hardware.md; nothing is fitted to the paper's
Table 2.
"""
from __future__ import annotations

from pearl_sglang.core import Profile, decide
from pearl_sglang.core.gate import gate_for_profile

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
REGIMES = {
    "cache-friendly (delta_L = 1,000)": Profile(delta_L=NEW_PER_TURN, **COMMON),
    "prefill-heavy (delta_L = 30 r = 9,000)": Profile(delta_L=30 * GENERATED, **COMMON),
}
SCENARIOS = [(10, False, "2P3D"), (10, True, "4P9D (best 5P8D)"), (12, False, "3P3D"),
             (12, True, "4P10D"), (16, False, "3P5D"), (16, True, "4P12D")]
T_TOGGLE = 6.26 + 3.18                       # paper Table 3, 8B activation + deactivation


def break_even_t_over(profile: Profile, n: int, pd_best_s: float) -> float:
    """T_over at which colocation would predict the same makespan as the best PD split:
    solve equation (1) for T_over."""
    per_turn = (profile.B * profile.delta_L / n) * profile.t_prefill + profile.r * (profile.A + profile.b * profile.B / n)
    return (pd_best_s - profile.T_env) / profile.S - per_turn


def table(profile: Profile) -> str:
    rows = ["| dedicated GPUs | overlap | N | engine picks | predicted s | best PD split | PD vs pick "
            "| T_over break-even s | infeasible PD | paper Table 2 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for gpus, overlap, paper in SCENARIOS:
        n = gpus // 2 + (8 if overlap else 0)
        d = decide(profile, budget=n)
        pd = min((c for c in d.candidates if c.feasible and c.topology.mode.value == "disaggregated"),
                 key=lambda c: c.predicted_makespan_s)
        bad = [c.topology.label() for c in d.candidates if not c.feasible]
        rows.append(f"| {gpus} | {'yes' if overlap else 'no'} | {n} | {d.choice.label()} | "
                    f"{d.predicted_makespan_s:.1f} | {pd.topology.label()} | "
                    f"{pd.predicted_makespan_s / d.predicted_makespan_s - 1:+.1%} | "
                    f"{break_even_t_over(profile, n, pd.predicted_makespan_s):.2f} | "
                    f"{', '.join(bad) or '-'} | {paper} |")
    return "\n".join(rows)


def gate_lines(profile: Profile) -> str:
    out = []
    for gpus in (10, 12, 16):
        g = gate_for_profile(profile, dedicated_workers=gpus // 2, overlap_workers=8, remaining=profile.B / 2,
                             toggle_cost_s=T_TOGGLE)
        out.append(f"- {gpus} dedicated GPUs, R = B/2: {g.reason} -> {'borrow' if g.borrow else 'do not borrow'}")
    return "\n".join(out)


def main() -> None:
    print("Inputs common to both regimes:\n")
    print("| symbol | value |\n|---|---|")
    for k, v in COMMON.items():
        print(f"| {k} | {v:.4g} |")
    for name, prof in REGIMES.items():
        print(f"\n### {name}\n")
        print(table(prof))
        print()
        print(gate_lines(prof))


if __name__ == "__main__":
    main()
