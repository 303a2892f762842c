"""Generate the decision tables in docs/decisions.md from the real decision engine.

Run: ``python docs/decisions_table.py`` (prints Markdown).  Every input is derived below
from /work/shared/reference/workload-and-hardware.md; nothing is fitted to the paper's
Table 2.
"""
from __future__ import annotations

from pearl_sglang.core import Profile, decide
from pearl_sglang.core.gate import gate_for_profile

from pearl_sglang.core.presets import COMMON, GENERATED, NEW_PER_TURN  # noqa: E402

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
