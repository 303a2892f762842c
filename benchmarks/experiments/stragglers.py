"""Stragglers first (ablation): the same fixed colocated pool with and without the router's
straggler mechanisms, side by side: rollout time over the latency floor, step and rollout
throughput, and where the step's tail comes from.

Variants (every one the same system, ``pearl-no-borrow`` on reserved GPUs, colocated):

* ``off``: plain cost-aware placement, no priorities;
* ``priority``: ``--straggler-priority`` (predicted stragglers' turns carry SGLang priority
  1, others 0) with workers launched with ``--enable-priority-scheduling``;
* ``isolation``: ``--straggler-isolation`` (the tail's stragglers placed on the least
  contended workers, other turns kept off theirs);
* ``both``: stragglers first, priority and isolation together.

The mechanism columns: for the step's last trajectory to finish, its time in requests
over what the same turns take alone on an idle worker (its contention), and the same for
the other trajectories of the step's last tenth; and whether the last one was among the
trajectories the router could have known to be slowest (the floor's slowest).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from benchmarks.experiments import fixed
from benchmarks.experiments.floor import over_floor, replay_config, trajectory_floor_s
from benchmarks.experiments.report import md_table, write
from benchmarks.experiments.runner import Job, arg_parser, results_name, run_jobs
from pearl_sglang.emulator.profile import load_profile
from pearl_sglang.workload.swe import SweSampler

NAME = "stragglers"
PRIORITY_ARGS = ("--enable-priority-scheduling",)
VARIANTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "off": ({}, ()),
    "priority": ({"straggler_priority": True}, PRIORITY_ARGS),
    "isolation": ({"straggler_isolation": True}, ()),
    "both": ({"straggler_priority": True, "straggler_isolation": True}, PRIORITY_ARGS),
}


def job(gpus: int, batch: int, variant: str, *, steps: int, preset: str) -> Job:
    base = fixed.job(gpus=gpus, pd_mode="colocated", batch=batch, steps=steps, preset=preset)
    router, engine = VARIANTS[variant]
    name = base.name + ("" if variant == "off" else f"-{variant}")
    return Job(name, replace(base.config, router=router, engine_args=engine))


def tail_mechanism(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per measured step: the last trajectory to finish, its contention (seconds in
    requests over the same turns alone), the mean contention of the step's last tenth
    and of the rest, and whether the last one is the floor's slowest trajectory."""
    config = replay_config(result)
    sampler, cost = SweSampler(config.sweworkload()), load_profile(config.emulator_profile()).cost
    out = []
    for step in result["steps"][1:]:
        rows = step.get("trajectories") or []
        if not rows:
            continue
        timed = []
        for tid, turns, req, env in rows:
            alone, alone_env = trajectory_floor_s(sampler, int(tid.rsplit("-", 1)[1]), cost)
            timed.append({"trajectory": tid, "turns": turns, "duration_s": req + env, "request_s": req,
                          "contention": req / max(alone - alone_env, 1e-9), "floor_s": alone})
        timed.sort(key=lambda t: -t["duration_s"])
        k = max(1, len(timed) // 10)
        slowest_floor = max(timed, key=lambda t: t["floor_s"])["trajectory"]
        out.append({"step": step["step"], "last": timed[0], "last_is_floor_slowest": timed[0]["trajectory"] == slowest_floor,
                    "tail_contention": sum(t["contention"] for t in timed[:k]) / k,
                    "rest_contention": sum(t["contention"] for t in timed[k:]) / max(1, len(timed) - k)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(NAME, __doc__)
    args = parser.parse_args(argv)
    pools, batch, steps = (((8, 16), 32, 2) if args.quick else ((8, 16), 64, 3))
    name = results_name(NAME, quick=args.quick, preset=args.preset)
    grid = {(g, v): job(g, batch, v, steps=steps, preset=args.preset) for g in pools for v in VARIANTS}
    results = run_jobs(name, list(grid.values()), parallel=args.parallel)
    rows, cells = [], []
    for g in pools:
        off = results[grid[(g, "off")].name]
        off_floor, off_tput = over_floor(off), off["summary"]["mean_throughput_tok_s"]
        for v in VARIANTS:
            r = results[grid[(g, v)].name]
            of, tput = over_floor(r), r["summary"]["mean_throughput_tok_s"]
            cut = (off_floor - of) / (off_floor - 1.0) if off_floor > 1.0 else 0.0
            mech = tail_mechanism(r)
            cells.append({"gpus": g, "variant": v, "rollout_over_floor": of, "cut_of_distance_to_1": cut,
                          "tok_s": tput, "tok_s_vs_off": tput / off_tput,
                          "rollout_tok_s": r["summary"]["rollout_throughput_tok_s"],
                          "rollout_s": [s["rollout_s"] for s in r["steps"]], "tail": mech})
            last = "; ".join(f"{m['last']['trajectory']} {m['last']['contention']:.2f}x"
                             + (" (floor's slowest)" if m["last_is_floor_slowest"] else "") for m in mech)
            tail = "; ".join(f"{m['tail_contention']:.2f}x / {m['rest_contention']:.2f}x" for m in mech)
            rows.append([f"{g} GPUs", v, f"{of:.3f}", "-" if v == "off" else f"{cut:+.0%}", f"{tput:.0f}",
                         "-" if v == "off" else f"{tput / off_tput:.3f}",
                         ", ".join(f"{s['rollout_s']:.0f}" for s in r["steps"][1:]), last, tail])
    md = (f"# Stragglers first (ablation)\n\nFixed colocated pools of reserved GPUs (TP2 workers, no borrowing), "
          f"Qwen3-8B, batch {batch}, preset `{args.preset}`, {steps} steps (the first excluded). "
          f"`cut`: the share of the distance from `off`'s rollout/floor to 1.0 that the variant removes "
          f"(the issue asks for at least a third, with no throughput loss). Contention: a trajectory's "
          f"time in requests over the same turns alone on an idle worker.\n\n"
          + md_table(["pool", "variant", "rollout / floor", "cut", "step tok/s", "tok/s vs off",
                      "rollout s (measured steps)", "last trajectory: contention",
                      "contention: last tenth / rest"], rows))
    write(name, {"preset": args.preset, "batch": batch, "steps": steps, "pools": pools, "cells": cells}, md)
    return 0
