"""Scale benchmark of the emulated worker (not a timed test).

Two parts:
  inprocess  16 in-process engines (colocated, or PD with --pd P:D) on virtual time run
             one rollout step of 64 SWE-like trajectories (30 turns, ~800 new prompt
             tokens and ~300 generated tokens per turn, lognormal environment latency);
             reports CPU seconds against emulated seconds.
  http       one ``python -m pearl_sglang.emulator`` process at --time-scale 1 serves 256
             concurrent streaming /generate requests; reports each request's client-seen
             latency against the model's own e2e_latency (timing error).

  python benchmarks/emulator_scale.py [inprocess|http|all] [--profile NAME] [--pd 4:12]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.cli_args import known_profile, pd_ratio, positive_int  # noqa: E402
from benchmarks.harness.virtual_cluster import VirtualCluster  # noqa: E402
from pearl_sglang.emulator import (Bootstrap, EngineConfig, GenerateRequest, DisaggregationMode,  # noqa: E402
                                   SamplingParams, load_profile)


def run_inprocess(profile_name: str, workers: int, trajectories: int, turns: int,
                  pd: str | None, seed: int) -> dict:
    profile = load_profile(profile_name)
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)

    def tokens(n: int) -> list[int]:
        return nrng.integers(1000, 150_000, size=n).tolist()
    cluster = VirtualCluster()
    if pd:
        n_p, n_d = (int(x) for x in pd.split(":"))
        prefills = [cluster.add_engine(profile, EngineConfig(role=DisaggregationMode.PREFILL, bootstrap_port=20000 + i))
                    for i in range(n_p)]
        decodes = [cluster.add_engine(profile, EngineConfig(role=DisaggregationMode.DECODE, bootstrap_port=21000 + i))
                   for i in range(n_d)]
    else:
        colo = [cluster.add_engine(profile) for _ in range(workers)]
    done = [0]
    stats = {"turns": 0, "generated": 0, "prompt": 0, "cached": 0}
    room = [0]

    def start_turn(i: int, context: list[int], turn: int) -> None:
        new = tokens(int(rng.uniform(700, 900)))
        context = context + new
        max_new = int(rng.uniform(200, 400))
        sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
        rid = f"traj{i}-turn{turn}"

        def finished(h) -> None:
            stats["turns"] += 1
            stats["generated"] += len(h.output_ids)
            stats["prompt"] += h.prompt_tokens
            stats["cached"] += h.cached_tokens
            if turn + 1 >= turns:
                done[0] += 1
                return
            env = min(300.0, rng.lognormvariate(0.0, 1.8))  # median 1 s, p90 ~10 s
            ctx = context + h.output_ids
            cluster.call_later(env, lambda: start_turn(i, ctx, turn + 1))
        if pd:
            room[0] += 1
            p = prefills[i % len(prefills)]
            d = decodes[i % len(decodes)]
            req = GenerateRequest(rid, tuple(context), sp,
                                  bootstrap=Bootstrap("127.0.0.1", p.config.bootstrap_port, room[0]))
            d.submit(req, on_finish=finished)
            p.submit(req)
        else:
            colo[i % len(colo)].submit(GenerateRequest(rid, tuple(context), sp), on_finish=finished)

    for i in range(trajectories):
        system = tokens(int(rng.uniform(2000, 4000)))
        cluster.call_at(0.0, lambda i=i, s=system: start_turn(i, s, 0))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    cluster.run()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert done[0] == trajectories, "not every trajectory finished"
    return {"part": "inprocess", "profile": profile_name, "mode": f"pd {pd}" if pd else f"colocated x{workers}",
            "trajectories": trajectories, "turns": stats["turns"], "emulated_s": round(cluster.clock.now(), 1),
            "cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "generated_tokens": stats["generated"],
            "prompt_tokens": stats["prompt"], "cache_hit": round(stats["cached"] / max(stats["prompt"], 1), 3),
            "speedup": round(cluster.clock.now() / max(wall, 1e-9), 1)}


async def _client(url: str, n: int, prompt_len: int, max_new: int) -> list[tuple[float, float]]:
    import aiohttp
    results: list[tuple[float, float]] = []

    async def one(s: aiohttp.ClientSession, i: int) -> None:
        body = {"input_ids": list(range(i * prompt_len, (i + 1) * prompt_len)), "stream": True,
                "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}
        t0 = time.perf_counter()
        last = None
        async with s.post(f"{url}/generate", json=body) as r:
            async for raw in r.content:
                if raw.startswith(b"data: {"):
                    last = raw
        seen = time.perf_counter() - t0
        meta = json.loads(last[6:])["meta_info"]
        results.append((seen, meta["e2e_latency"]))

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(one(s, i) for i in range(n)))
    return results


def run_http(profile_name: str, n: int, prompt_len: int, max_new: int) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "pearl_sglang.emulator", "--port", str(port),
                             "--profile", profile_name, "--time-scale", "1", "--cold-start", "0",
                             "--disable-radix-cache"], env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        import urllib.request
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        res = asyncio.run(_client(url, n, prompt_len, max_new))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    errors = sorted(abs(seen - model) / model for seen, model in res)
    return {"part": "http", "profile": profile_name, "requests": n, "prompt_len": prompt_len,
            "max_new_tokens": max_new, "model_e2e_mean_s": round(statistics.mean(m for _, m in res), 3),
            "client_e2e_mean_s": round(statistics.mean(s for s, _ in res), 3),
            "timing_error_mean": round(statistics.mean(errors), 4),
            "timing_error_p50": round(errors[len(errors) // 2], 4),
            "timing_error_max": round(errors[-1], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", default="all", choices=["inprocess", "http", "all"])
    ap.add_argument("--profile", type=known_profile, default="qwen3-8b-h800-tp2")
    ap.add_argument("--workers", type=positive_int, default=16)
    ap.add_argument("--trajectories", type=positive_int, default=64)
    ap.add_argument("--turns", type=positive_int, default=30)
    ap.add_argument("--pd", type=pd_ratio, default=None, help="P:D split instead of colocated, e.g. 4:12")
    ap.add_argument("--requests", type=positive_int, default=256)
    ap.add_argument("--prompt-len", type=positive_int, default=1000)
    ap.add_argument("--max-new", type=positive_int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.part in ("inprocess", "all"):
        print(json.dumps(run_inprocess(a.profile, a.workers, a.trajectories, a.turns, a.pd, a.seed)))
    if a.part in ("http", "all"):
        print(json.dumps(run_http(a.profile, a.requests, a.prompt_len, a.max_new)))


if __name__ == "__main__":
    main()
