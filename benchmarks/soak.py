"""Soak: a random stream of elastic events while multi-turn requests keep flowing.

An emulated cluster (router + control plane + in-process workers) takes joins, leaves,
train_begin/train_finished, weight pushes and PD-mode changes in random order while
trajectories send turn after turn. Afterwards it checks, and prints the counts of:
every accepted request completed (token-exact against a reference worker at the same
weight version) or got an explicit error; no request was routed to a worker that was
not active; no borrowed GPU was held after a train_begin answered; the table's
invariants held after every change (the cluster harness checks them on every update
and fails the run otherwise).

    python benchmarks/soak.py [--quick] [--events 1000] [--requests 10000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from pearl_sglang.control.cluster_config import ClusterConfig  # noqa: E402
from pearl_sglang.core.state import Activity, Zone  # noqa: E402
from pearl_sglang.router.state import ROUTER  # noqa: E402
from benchmarks.harness.cli_args import positive_float, positive_int  # noqa: E402
from benchmarks.harness.cluster import TINY_PROFILE, running_cluster  # noqa: E402


@dataclass
class Counts:
    events: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    completed: int = 0
    explicit_errors: int = 0
    lost: int = 0
    checked_exact: int = 0
    mismatched: int = 0
    routed_inactive: int = 0
    held_after_train_begin: int = 0


def config(model: Path, time_scale: float) -> ClusterConfig:
    return ClusterConfig.from_mapping({
        "engine": {"kind": "emulator", "model_path": str(model), "tp_size": 1,
                   "emulator": {"profile": "tiny", "time_scale": time_scale, "pd_timeout": 3000}},
        "zones": {"dedicated": ["d0:0", "d0:1", "d0:2"], "overlap": ["t0:0", "t0:1"]},
        "profile": TINY_PROFILE, "pd_mode": "colocated", "gate": {"enabled": False},
        "deadlines": {"train_begin_s": 30, "leave_s": 30, "drain_s": 5},
    })


def guard_routing(cluster, counts: Counts) -> None:
    """Count any routing choice of a worker the table does not show as active."""
    selector = cluster.app[ROUTER].selector
    choose = selector.choose

    def checked(table, **kw):
        target = choose(table, **kw)
        for w in (target.worker, target.prefill, target.decode):
            if w is not None and table.worker(w.slot).activity is not Activity.ACTIVE:
                counts.routed_inactive += 1
        return target

    selector.choose = checked


async def trajectory(c, rng: random.Random, budget: list[int], outcomes: list) -> None:
    ctx = [rng.randrange(10, 900) for _ in range(rng.randrange(8, 64))]
    while budget[0] > 0:
        budget[0] -= 1
        body = {"input_ids": ctx, "sampling_params": {"max_new_tokens": rng.randrange(4, 24), "ignore_eos": True}}
        try:
            r = await c.client.post(c.url + "/generate", json=body, timeout=120)
        except httpx.HTTPError as e:
            outcomes.append(("lost", body, repr(e)))
            continue
        if r.status_code != 200:
            explicit = r.headers.get("content-type", "").startswith("application/json") and "error" in r.json()
            outcomes.append(("error" if explicit else "lost", body, r.text[:200]))
            continue
        out = r.json()
        outcomes.append(("ok", body, out))
        ctx = ctx + out["output_ids"] + [rng.randrange(10, 900) for _ in range(rng.randrange(4, 32))]
        if len(ctx) > 3000:
            ctx = ctx[:64]


async def events(c, rng: random.Random, n: int, counts: Counts, model: Path) -> None:
    joined: list[str] = []
    training, step = False, 0
    for k in range(n):
        x = rng.random()
        if x < 0.25:
            gpu = f"p{k}:0"
            await c.admin("/pearl/gpus", {"action": "join", "gpus": [gpu]})
            joined.append(gpu)
            kind = "join"
        elif x < 0.45 and joined:
            await c.admin("/pearl/gpus", {"action": "leave", "gpus": [joined.pop(rng.randrange(len(joined)))],
                                          "deadline_s": 30})
            kind = "leave"
        elif x < 0.75:
            if training:
                await c.admin("/train_finished", {"step": step})
                step += 1
                kind = "train_finished"
            else:
                await c.admin("/train_begin", {"step": step})
                kind = "train_begin"
                for w in c.table.rollout_workers():
                    if w.zone is Zone.OVERLAP and (w.activity is not Activity.INACTIVE
                                                   or not c.launcher.worker(w.slot).engine.released_tags):
                        counts.held_after_train_begin += 1
            training = not training
        elif x < 0.88:
            await c.admin("/update_weights", {"version": f"v{k}", "model_path": str(model)})
            kind = "weights"
        else:
            await c.admin("/pearl/pd_mode", {"pd_mode": rng.choice(["disaggregated", "colocated"])})
            kind = "pd_mode"
        counts.events[kind] = counts.events.get(kind, 0) + 1
        await asyncio.sleep(rng.uniform(0, 0.02))


async def run(n_events: int, n_requests: int, seed: int, time_scale: float) -> Counts:
    rng = random.Random(seed)
    model = Path(tempfile.mkdtemp(prefix="pearl-soak-"))
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 1024}))
    counts = Counts()
    cfg = config(model, time_scale)
    async with running_cluster(cfg, settle_s=60) as c:
        guard_routing(c, counts)
        budget = [n_requests]
        outcomes: list = []
        walkers = [asyncio.ensure_future(trajectory(c, random.Random(rng.random()), budget, outcomes))
                   for _ in range(24)]
        await events(c, rng, n_events, counts, model)
        await asyncio.gather(*walkers)
        await c.settle(60)
    counts.requests = len(outcomes)
    counts.completed = sum(o[0] == "ok" for o in outcomes)
    counts.explicit_errors = sum(o[0] == "error" for o in outcomes)
    counts.lost = sum(o[0] == "lost" for o in outcomes)
    await exact_sample(outcomes, counts, model, rng)
    return counts


async def exact_sample(outcomes: list, counts: Counts, model: Path, rng: random.Random, sample: int = 300) -> None:
    from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
    from pearl_sglang.control.launchers import LaunchSpec
    from pearl_sglang.core.state import Role

    single = [o for o in outcomes if o[0] == "ok" and len(o[2]["meta_info"]["weight_versions"]) == 1]
    picked = rng.sample(single, min(sample, len(single)))
    launcher = InProcessEmulatorLauncher(config(model, 1000.0).engine)
    ref = await launcher.launch(LaunchSpec(0, Role.COLOCATED, ("ref:0",)))
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for version in sorted({o[2]["meta_info"]["weight_version"] for o in picked}):
                await client.post(ref.endpoint + "/update_weight_version",
                                  json={"new_version": version, "abort_all_requests": False})
                for _, body, out in (o for o in picked if o[2]["meta_info"]["weight_version"] == version):
                    r = (await client.post(ref.endpoint + "/generate", json=body)).json()
                    counts.checked_exact += 1
                    counts.mismatched += r["output_ids"] != out["output_ids"]
    finally:
        await launcher.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 events, 1,000 requests (CI)")
    parser.add_argument("--events", type=positive_int, default=1000)
    parser.add_argument("--requests", type=positive_int, default=10000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--time-scale", type=positive_float, default=50.0)
    args = parser.parse_args()
    n_events, n_requests = (100, 1000) if args.quick else (args.events, args.requests)
    counts = asyncio.run(run(n_events, n_requests, args.seed, args.time_scale))
    print(json.dumps(counts.__dict__, indent=1))
    bad = counts.lost + counts.mismatched + counts.routed_inactive + counts.held_after_train_begin
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
