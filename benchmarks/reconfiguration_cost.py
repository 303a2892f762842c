"""Reconfiguration cost (the paper's Table 3) from the control plane's own phase timings.

Runs PEARL's router and control plane in one event loop over emulated workers (Qwen3-8B
or Qwen3-30B-A3B profiles on H800-class GPUs, TP2) at a time scale, drives repeated
borrow/return cycles (intra-scale activation and deactivation) and preemptible joins and
leaves (inter-scale preparation and finalization), and reports each phase's mean in
emulated seconds next to Table 3. The emulator takes its lifecycle costs from the profile,
so the interesting number is PEARL's own overhead: measured phase time minus the modeled
engine cost, in real milliseconds (aim: under 100 ms per operation).

    python benchmarks/reconfiguration_cost.py [--quick] [--profile qwen3-8b-h800-tp2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pearl_sglang.control.cluster_config import ClusterConfig  # noqa: E402
from pearl_sglang.core.presets import qwen3_8b_tp2  # noqa: E402
from pearl_sglang.emulator.profile import load_profile  # noqa: E402
from benchmarks.harness.cli_args import positive_float  # noqa: E402
from benchmarks.harness.cluster import running_cluster  # noqa: E402

PAPER = {  # Table 3, seconds: (Qwen3-8B, Qwen3-30B-A3B)
    "inter_scale/preparation": (56.29, 67.06), "inter_scale/finalization": (11.05, 17.89),
    "intra_scale/activation": (6.26, 6.09), "intra_scale/deactivation": (3.18, 4.38),
}


def modeled_s(phase: str, lifecycle) -> float:
    """The engine cost the emulator charges for a phase (what PEARL cannot make faster)."""
    return {
        "inter_scale/preparation": lifecycle.cold_start_s,  # no push happened: no weight sync
        "inter_scale/finalization": 0.0,
        "intra_scale/activation": lifecycle.resume_s + lifecycle.weight_update_disk_s,
        "intra_scale/deactivation": lifecycle.release_s,
    }[phase]


async def measure(profile_name: str, cycles: int, time_scale: float) -> dict:
    model = Path(tempfile.mkdtemp(prefix="pearl-reconf-"))
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936}))
    config = ClusterConfig.from_mapping({
        "engine": {"kind": "emulator", "model_path": str(model), "tp_size": 2,
                   "emulator": {"profile": profile_name, "time_scale": time_scale}},
        "zones": {"dedicated": [f"r0:{i}" for i in range(4)], "overlap": [f"t{i // 8}:{i % 8}" for i in range(16)]},
        "profile": qwen3_8b_tp2().__dict__, "pd_mode": "colocated", "gate": {"enabled": False},
        "time_scale": time_scale,
    })
    async with running_cluster(config, settle_s=600) as c:
        for step in range(cycles):
            await c.admin("/train_begin", {"step": step})
            await c.admin("/train_finished", {"step": step})
            await c.settle(600)
            node = f"spot{step}"
            await c.admin("/pearl/gpus", {"action": "join", "gpus": [f"{node}:0", f"{node}:1"]})
            await c.admin("/pearl/gpus", {"action": "leave", "gpus": [f"{node}:0", f"{node}:1"], "deadline_s": 60})
        await c.admin("/train_begin", {"step": cycles})
        return {name: dict(v) for name, v in c.control.phases.summary().items()}


def report(profile_name: str, column: int, phases: dict, time_scale: float) -> list[dict]:
    lifecycle = load_profile(profile_name).lifecycle
    rows = []
    for phase, paper in PAPER.items():
        got = phases.get(phase)
        if got is None:
            continue
        emulated = got["mean_s"] * time_scale
        modeled = modeled_s(phase, lifecycle)
        rows.append({"phase": phase, "count": got["count"], "measured_emulated_s": emulated,
                     "paper_s": paper[column], "modeled_engine_s": modeled,
                     "pearl_overhead_real_ms": (got["mean_s"] - modeled / time_scale) * 1000})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--time-scale", type=positive_float, default=100.0)
    parser.add_argument("--out", default=None, help="default: benchmarks/results/reconfiguration_cost[-quick].json")
    args, _ = parser.parse_known_args(argv)  # ignores the suite's --parallel
    cycles = 2 if args.quick else 5
    args.out = args.out or f"benchmarks/results/reconfiguration_cost{'-quick' if args.quick else ''}.json"
    results = {}
    for column, name in enumerate(("qwen3-8b-h800-tp2", "qwen3-30b-a3b-h800-tp2")):
        print(f"measuring {name}: {cycles} borrow/return cycles and {cycles} joins/leaves at {args.time_scale:g}x",
              flush=True)
        phases = asyncio.run(measure(name, cycles, args.time_scale))
        results[name] = report(name, column, phases, args.time_scale)
    lines = ["| model | phase | n | PEARL (emulated s) | paper Table 3 (s) | modeled engine cost (s) | "
             "PEARL overhead (real ms) |", "|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            lines.append(f"| {name} | {r['phase']} | {r['count']} | {r['measured_emulated_s']:.2f} | {r['paper_s']:.2f} | "
                         f"{r['modeled_engine_s']:.2f} | {r['pearl_overhead_real_ms']:.1f} |")
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"time_scale": args.time_scale, "results": results}, indent=1))
    out.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
