"""Placement benchmark: where an agentic RL rollout's work lands, PEARL's router against
sglang-router 0.3.2, over the same emulated workers in one run.

    .venv/bin/python -m benchmarks.placement [--quick] [--out benchmarks/results/placement.json]

Workers are emulated SGLang servers (``--profile``, default Qwen3-8B on H800 TP2) served
in this process on loopback ports. Each router runs as its own process
(``benchmarks.placement_targets``): PEARL's (attach mode, ``--routing-policy`` cost,
cache_aware and round_robin) and sglang-router 0.3.2 (the Rust router, ``cache_aware`` and
``round_robin``) from the real-SGLang CPU stack when it is set up
(``scripts/setup_sglang_cpu.sh``), else its rows are left out and the run says so.

Workload (GRPO): ``--groups`` groups of ``--group-size`` trajectories; members of a group
share one ``--prompt-tokens`` prompt; each trajectory runs ``--turns`` turns of
``--max-new-tokens`` (ignore_eos), then waits ``--env-s`` on its environment and appends
``--observation-tokens`` fresh tokens; ``--rewrite-fraction`` of the context's tail is
replaced before each new turn (0: the cache-friendly regime). Every trajectory starts at
once, as a rollout step does. Requests carry PEARL's trajectory headers (sglang-router
ignores them) and ``text`` prompts (the emulator's byte codec: one character per token),
which both routers can key their prefix trees on. Each trajectory has its own
``sampling_seed`` and the workers share one model seed, so a trajectory generates the same
tokens whichever worker serves it, and the members of a group differ (as sampled GRPO
responses do): routers are compared on identical token streams.

Scenarios, each for every target:

* ``grpo``: all ``--workers`` active. Reported per worker (from the workers' own counters):
  generated tokens, prompt tokens, cache-hit tokens, busy time, requests; busiest/mean
  generated tokens and busy time; workers used; cache hit rate; rollout time.
* ``join``: ``--workers``/2 active; the other half is admitted once a quarter of all turns
  has finished, through ``POST /workers`` on either router (each health-checks a worker
  before it routes to it). Reported: the share of the decode work generated after
  admission that the new workers took.

Beneath the summary (``benchmarks.placement_trace``): per worker, prefill tokens computed,
prefill and decode-only iteration time, iterations, queue depths over time and the wait in
the worker; per request, its worker and its wait in the router; per trajectory, the
workers of its turns.

Rollout time is emulated seconds (wall time x ``--time-scale``). Writes JSON and a
Markdown table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
STACK_DIR = REPO / ".sglang-cpu"

from benchmarks.harness.cli_args import positive_float, positive_int  # noqa: E402
from benchmarks.harness.servers import SglangCpuStack  # noqa: E402
from pearl_sglang.emulator import server as emu  # noqa: E402
from pearl_sglang.emulator.config import EmulatorArgs  # noqa: E402
from pearl_sglang.router.utilization import busiest_over_mean  # noqa: E402

from benchmarks.placement_targets import PearlTarget, SglangTarget  # noqa: E402
from benchmarks.placement_trace import Recorder  # noqa: E402

PEARL_POLICIES = ("cost", "cache_aware", "round_robin")
SGLANG_POLICIES = ("cache_aware", "round_robin")
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:-_=+()[]{}"


@dataclass(frozen=True)
class Workload:
    groups: int = 4
    group_size: int = 16
    prompt_tokens: int = 2048
    turns: int = 4
    max_new_tokens: int = 96
    observation_tokens: int = 256
    env_s: float = 1.0
    rewrite_fraction: float = 0.0
    seed: int = 0

    @property
    def trajectories(self) -> int:
        return self.groups * self.group_size


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


# ---- workers ------------------------------------------------------------------------------
@dataclass
class Pool:
    workers: list[emu.Worker]
    urls: list[str]
    runners: list[web.AppRunner]
    recorder: Recorder

    def counters(self) -> list[dict[str, float]]:
        return [{"generated_tokens": w.engine.stats.generation_tokens, "prompt_tokens": w.engine.stats.prompt_tokens,
                 "cached_tokens": w.engine.stats.cached_tokens, "busy_s": w.engine.stats.busy_s,
                 "requests": w.engine.stats.requests, "prefill_tokens": w.engine.stats.prefill_tokens,
                 "prefill_iteration_s": w.engine.stats.prefill_iteration_s,
                 "decode_only_s": w.engine.stats.decode_only_s, "iterations": w.engine.stats.iterations}
                for w in self.workers]

    async def flush(self, session: aiohttp.ClientSession) -> None:
        for url in self.urls:
            for _ in range(200):
                async with session.post(url + "/flush_cache") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)


async def start_pool(n: int, profile: str, time_scale: float, model_dir: Path) -> Pool:
    workers, urls, runners = [], [], []
    for i in range(n):
        w = emu.build_worker(EmulatorArgs(model_path=str(model_dir), profile=profile, time_scale=time_scale,
                                          cold_start=0))
        runner, _extra, port, _ = await emu.start(w, host="127.0.0.1", port=0)
        workers.append(w)
        urls.append(f"http://127.0.0.1:{port}")
        runners.append(runner)
    recorder = Recorder(workers, time_scale)
    recorder.install()
    return Pool(workers, urls, runners, recorder)


# ---- workload -----------------------------------------------------------------------------
@dataclass
class Progress:
    turns_done: int = 0
    errors: int = 0
    sent: dict[str, float] = field(default_factory=dict)  # rid -> send time (the trace's router wait)


async def trajectory(session: aiohttp.ClientSession, url: str, wl: Workload, index: int, prompt: str,
                     time_scale: float, progress: Progress, run: str) -> None:
    rng = random.Random(f"{wl.seed}-{index}")
    context = prompt
    for turn in range(wl.turns):
        body = {"text": context, "sampling_params": {"max_new_tokens": wl.max_new_tokens, "ignore_eos": True,
                                                     "temperature": 1.0, "sampling_seed": wl.seed * 1_000_003 + index},
                "rid": f"{run}-{index}-{turn}"}
        headers = {"X-Pearl-Trajectory-Id": f"{run}-{index}", "X-Pearl-Turn": str(turn)}
        progress.sent[body["rid"]] = time.monotonic()
        async with session.post(url + "/generate", json=body, headers=headers) as r:
            if r.status != 200:
                progress.errors += 1
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
            out = await r.json()
        progress.turns_done += 1
        if turn + 1 == wl.turns:
            return
        await asyncio.sleep(wl.env_s / time_scale)
        k = int(round(wl.rewrite_fraction * len(context)))
        context = context[:len(context) - k] + _text(rng, k) + out["text"] + _text(rng, wl.observation_tokens)


async def run_one(target, pool: Pool, wl: Workload, time_scale: float, *, join: bool, run: str) -> dict[str, Any]:
    rng = random.Random(wl.seed)
    prompts = [_text(rng, wl.prompt_tokens) for _ in range(wl.groups)]
    progress = Progress()
    pool.recorder.start()
    pool.recorder.sent = progress.sent
    sampler = asyncio.ensure_future(pool.recorder.sample())
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await pool.flush(session)
        before = pool.counters()
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(trajectory(session, target.url, wl, i, prompts[i // wl.group_size],
                                                  time_scale, progress, run))
                 for i in range(wl.trajectories)]
        at_join = None
        if join:
            total = wl.trajectories * wl.turns
            while progress.turns_done < total // 4 and not all(t.done() for t in tasks):
                await asyncio.sleep(0.01)
            await target.admit_rest(session)
            at_join = pool.counters()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - t0
        after = pool.counters()
        migrations = await target.migrations(session)
    sampler.cancel()
    per_worker = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    result: dict[str, Any] = {"target": target.name, "rollout_s": elapsed * time_scale,
                              "per_worker": per_worker, "migrations": migrations, **balance(per_worker),
                              "trace": pool.recorder.report()}
    if at_join is not None:
        half = len(pool.workers) - target.active
        after_join = [a["generated_tokens"] - j["generated_tokens"] for a, j in zip(after, at_join)]
        result["join"] = {"generated_after_admission": after_join,
                          "new_workers_share": sum(after_join[-half:]) / max(1, sum(after_join))}
    return result


def balance(per_worker: list[dict[str, float]]) -> dict[str, Any]:
    gen = [w["generated_tokens"] for w in per_worker]
    busy = [w["busy_s"] for w in per_worker]
    prompt = sum(w["prompt_tokens"] for w in per_worker)
    return {
        "generated_busiest_over_mean": busiest_over_mean(gen) or 0.0,
        "busy_busiest_over_mean": busiest_over_mean(busy) or 0.0,
        "workers_used": sum(1 for g in gen if g > 0),
        "cache_hit_rate": sum(w["cached_tokens"] for w in per_worker) / prompt if prompt else 0.0,
    }


# ---- main ---------------------------------------------------------------------------------
def sglang_stack() -> Optional[SglangCpuStack]:
    try:
        stack = SglangCpuStack.load(STACK_DIR)
    except (OSError, ValueError, KeyError):
        return None
    python = Path(stack.python)
    if not list((python.parents[1] / "lib").glob("python*/site-packages/sglang_router-0.3.2.dist-info")):
        return None
    return stack


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    wl = Workload(groups=args.groups, group_size=args.group_size, prompt_tokens=args.prompt_tokens,
                  turns=args.turns, max_new_tokens=args.max_new_tokens, observation_tokens=args.observation_tokens,
                  env_s=args.env_s, rewrite_fraction=args.rewrite_fraction, seed=args.seed)
    stack = None if args.no_sglang_router else sglang_stack()
    notes = [] if stack is not None or args.no_sglang_router else [
        "sglang-router 0.3.2 is not set up (scripts/setup_sglang_cpu.sh): its rows are missing"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pearl-placement-") as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                                           "model_type": "qwen3", "vocab_size": 151936}))
        pool = await start_pool(args.workers, args.profile, args.time_scale, model_dir)
        try:
            for scenario in args.scenarios:
                join = scenario == "join"
                active = args.workers // 2 if join else args.workers
                targets = [PearlTarget(p, pool.urls, active) for p in args.pearl_policies]
                if stack is not None:
                    targets += [SglangTarget(p, pool.urls, active, stack) for p in SGLANG_POLICIES]
                for n, target in enumerate(targets):
                    async with target:
                        r = await run_one(target, pool, wl, args.time_scale, join=join, run=f"{scenario}{n}")
                    r["scenario"] = scenario
                    rows.append(r)
                    print(line(r), flush=True)
        finally:
            for runner in pool.runners:
                await runner.cleanup()
    return {"config": {**vars(args), "out": str(args.out), "workload": wl.__dict__}, "notes": notes,
            "rows": rows}


def line(r: dict[str, Any]) -> str:
    gen = [int(w["generated_tokens"]) for w in r["per_worker"]]
    s = (f"{r['scenario']:5} {r['target']:26} rollout {r['rollout_s']:7.1f} s  gen busiest/mean "
         f"{r['generated_busiest_over_mean']:.2f}  busy busiest/mean {r['busy_busiest_over_mean']:.2f}  "
         f"used {r['workers_used']}  hit {r['cache_hit_rate']:.2f}  gen {gen}")
    if "join" in r:
        s += f"  new workers' share after admission {r['join']['new_workers_share']:.2f}"
    return s


def markdown(result: dict[str, Any]) -> str:
    c = result["config"]
    out = [f"# Placement benchmark\n\n{c['workers']} emulated workers ({c['profile']}, time scale "
           f"{c['time_scale']:g}); {c['groups']} GRPO groups x {c['group_size']}, {c['prompt_tokens']}-token "
           f"shared prompt, {c['turns']} turns of {c['max_new_tokens']} tokens, rewrite fraction "
           f"{c['rewrite_fraction']:g}.\n"]
    out += [f"Note: {n}\n" for n in result["notes"]]
    out += ["Router wait: from the client's send to the worker's submit (the router's parsing, choice and "
            "forwarding, and the worker's HTTP parse); worker wait: from the worker's submit to the first "
            "token (queue and prefill); both emulated seconds, per request. Turns moved: turns of a "
            "trajectory served by another worker than its previous turn.\n"]
    out += ["| scenario | router | rollout s | gen busiest/mean | busy busiest/mean | workers used | "
            "cache hit rate | new workers' share after join | turns moved | router wait s (mean) | "
            "worker wait s (mean) | generated tokens per worker |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        share = f"{r['join']['new_workers_share']:.2f}" if "join" in r else ""
        gen = ", ".join(str(int(w["generated_tokens"])) for w in r["per_worker"])
        t = r["trace"]
        used = [w for w in t["per_worker"] if w["requests"]]
        worker_wait = sum(w["mean_worker_wait_s"] * w["requests"] for w in used) / max(1, sum(w["requests"] for w in used))
        out.append(f"| {r['scenario']} | {r['target']} | {r['rollout_s']:.1f} | {r['generated_busiest_over_mean']:.2f} "
                   f"| {r['busy_busiest_over_mean']:.2f} | {r['workers_used']} | {r['cache_hit_rate']:.3f} | {share} "
                   f"| {t['turn_moves']} | {t['mean_router_wait_s']:.3f} | {worker_wait:.3f} | {gen} |")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.placement", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller workload (2 groups x 8, 2 turns, 4 workers)")
    ap.add_argument("--workers", type=positive_int, default=8)
    ap.add_argument("--groups", type=positive_int, default=4)
    ap.add_argument("--group-size", type=positive_int, default=16)
    ap.add_argument("--prompt-tokens", type=positive_int, default=2048)
    ap.add_argument("--turns", type=positive_int, default=4)
    ap.add_argument("--max-new-tokens", type=positive_int, default=96)
    ap.add_argument("--observation-tokens", type=int, default=256)
    ap.add_argument("--env-s", type=float, default=1.0, help="environment time between turns (emulated s)")
    ap.add_argument("--rewrite-fraction", type=float, default=0.0)
    ap.add_argument("--profile", default="qwen3-8b-h800-tp2")
    ap.add_argument("--time-scale", type=positive_float, default=None,
                    help="emulated seconds per real second (default 0.5, quick 2: slow enough that the "
                         "single process's CPU stays a small part of the emulated time)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", nargs="+", default=["grpo", "join"], choices=["grpo", "join"])
    ap.add_argument("--pearl-policies", nargs="+", default=list(PEARL_POLICIES), choices=PEARL_POLICIES)
    ap.add_argument("--no-sglang-router", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="JSON result (a .md table is written next to it)")
    ap.add_argument("--trace", action="store_true",
                    help="keep every request and queue-depth sample in the JSON (large)")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.groups, args.group_size, args.turns = 4, 2, 8, 2
        args.prompt_tokens, args.max_new_tokens, args.observation_tokens = 1024, 32, 64
    if args.time_scale is None:
        args.time_scale = 2.0 if args.quick else 0.5
    if args.workers < 2:
        ap.error("--workers must be >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # sglang-router probes new workers with a non-HTTP/1 request first; the workers' aiohttp
    # answers 400 and logs a traceback for each, which is noise here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    result = asyncio.run(bench(args))
    if not args.trace:
        for r in result["rows"]:
            r["trace"].pop("requests")
            r["trace"].pop("queue_samples")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
