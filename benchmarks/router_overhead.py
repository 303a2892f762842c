"""Router overhead benchmark (not a timed test): PEARL's router against direct-to-worker and
against sglang-router 0.3.2, in front of the same emulated SGLang workers, in one run.

    .venv/bin/python benchmarks/router_overhead.py [--quick] [--workers 2] [--concurrency 100]
        [--requests N] [--out benchmarks/results/router_overhead.json]

It starts ``--workers`` emulated workers (tiny profile, high ``--time-scale``, small
``max_new_tokens`` with ``ignore_eos``: generation costs a few milliseconds, so HTTP and
routing dominate), PEARL's router (attach mode), sglang-router (round_robin) and a byte relay
(``harness/relay.py``: the extra hop alone, no router's work; ``--no-relay`` skips it) in
front of them, and measures for each target in {direct (the client round-robins over the
workers), pearl, sglang-router, relay} x {non-streaming, streaming}:

  lat@C    closed loop, C client tasks each sending sequential requests: p50/p99 end to end;
  lat@1    the same with one client task (no queueing anywhere: the per-request cost);
  rps      maximum throughput, closed loop at --tp-concurrency (256) for a fixed duration.

Router-added latency is a DIFFERENCE OF PERCENTILES (router p50 - direct p50, router p99 -
direct p99, paired within each repeat), not a percentile of per-request differences.
Note on lat@C: with fast generation a closed loop at C=100 saturates the CPU, so latency is
about C / throughput (Little's law) and the added latency at C reflects throughput; lat@1
is the added cost of one request when nothing queues.

``--agentic`` adds 4K- and 32K-token prompts and multi-turn trajectories (``router_agentic``),
PEARL / sglang-router per repeat, with each router's CPU per request, and at one client its
CPU while each turn waited (from its process CPU clock): what the one-client latency is made of.

Cells run interleaved (all targets back to back for one (mode, phase), target order rotated
each repeat) so machine noise hits them alike; reported numbers are medians over repeats.
Every streaming response must end with ``data: [DONE]`` and every reply must have exactly
max_new_tokens output ids identical across targets (the emulator is deterministic), else
the run fails. Writes JSON and a Markdown table under benchmarks/results/.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness.cli_args import positive_float, positive_int  # noqa: E402
from benchmarks.harness.process_cpu import cpu_now, cpu_per_request  # noqa: E402
from benchmarks.harness.servers import SglangCpuStack, wait_all_healthy  # noqa: E402
from pearl_sglang.control.processes import ServerProcess, ServerSpec, free_port  # noqa: E402
from benchmarks import router_agentic  # noqa: E402  (as a script or as ``python -m benchmarks.router_overhead``)

STACK_DIR = REPO / ".sglang-cpu"
MODES = ("nonstream", "stream")
PROMPTS = 16        # distinct prompts, cycled
PROMPT_LEN = 24     # < 64 tokens: PEARL's prefix affinity has no key, it picks the least loaded


@dataclass
class Target:
    name: str
    urls: list[str]
    modes: tuple[str, ...] = MODES
    pid: int | None = None      # the router's process (for its memory and CPU), None for direct
    workers: tuple[int, ...] = ()  # the worker processes behind it (for their CPU)


def rss_mb(pid: int | None) -> float | None:
    """Resident memory (VmRSS) of one process, in MB."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


class BenchError(RuntimeError):
    pass


# ---- client -----------------------------------------------------------------------------
def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool,
               check: bool) -> tuple[float, float | None, int, dict | None]:
    """One /generate: (latency, time to first chunk, chunks, final JSON if check)."""
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    final = None
    async with session.post(url + "/generate", data=body,
                            headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise BenchError(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        if not stream:
            data = await resp.read()
            if check:
                final = json.loads(data)
        else:
            last = b""
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                if ttft is None:
                    ttft = time.perf_counter() - t0
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    last = payload
                    break
                chunks += 1
                last = payload
                if check:
                    final = json.loads(payload)
            if last != b"[DONE]":
                raise BenchError(f"{url}: stream ended without [DONE]")
    return time.perf_counter() - t0, ttft, chunks, final


async def closed_loop(session: aiohttp.ClientSession, urls: list[str], bodies: list[bytes],
                      stream: bool, concurrency: int, *, max_requests: int, max_s: float,
                      expect: dict[int, list[int]], max_new: int) -> dict[str, Any]:
    """C tasks send sequential requests until max_requests were sent or max_s elapsed."""
    rr = itertools.cycle(urls)
    counter = itertools.count()
    lats: list[float] = []
    ttfts: list[float] = []
    chunk_counts: list[int] = []
    deadline = time.perf_counter() + max_s

    async def worker() -> None:
        while time.perf_counter() < deadline:
            i = next(counter)
            if i >= max_requests:
                return
            p = i % len(bodies)
            check = i < 2 * len(bodies)   # validate the first replies of every prompt
            lat, ttft, chunks, final = await _one(session, next(rr), bodies[p], stream, check)
            lats.append(lat)
            if ttft is not None:
                ttfts.append(ttft)
            chunk_counts.append(chunks)
            if final is not None:
                ids = final.get("output_ids")
                if not isinstance(ids, list) or len(ids) != max_new:
                    raise BenchError(f"expected {max_new} output ids, got {final!r:.300}")
                if expect.setdefault(p, ids) != ids:
                    raise BenchError(f"prompt {p}: output ids differ between targets")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return summarize(lats, elapsed, ttfts, chunk_counts)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarize(lats: list[float], elapsed: float, ttfts: list[float], chunks: list[int]) -> dict[str, Any]:
    if not lats:
        raise BenchError("no request completed")
    out = {"n": len(lats), "elapsed_s": elapsed, "rps": len(lats) / elapsed,
           "p50_ms": pct(lats, 0.5) * 1e3, "p99_ms": pct(lats, 0.99) * 1e3,
           "mean_ms": statistics.fmean(lats) * 1e3, "chunks_mean": statistics.fmean(chunks)}
    if ttfts:
        out["ttft_p50_ms"] = pct(ttfts, 0.5) * 1e3
    return out


async def measure(targets: list[Target], args: argparse.Namespace
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    body_of = {
        mode: [json.dumps({"input_ids": p, "stream": mode == "stream",
                           "sampling_params": {"max_new_tokens": args.max_new_tokens, "ignore_eos": True}}
                          ).encode() for p in _prompts(args.seed)]
        for mode in MODES}
    expect: dict[int, list[int]] = {}
    phases = [("lat_c", args.concurrency, args.requests, args.lat_max_s),
              ("lat_1", 1, args.requests_c1, args.c1_max_s),
              ("tp", args.tp_concurrency, 10 ** 9, args.tp_seconds)]
    rows: list[dict[str, Any]] = []
    memory: dict[str, dict[str, float | None]] = {t.name: {} for t in targets if t.pid}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm every target: open connections (the routers open theirs upstream), JIT paths.
        for t in ([] if args.agentic_only else targets):
            for mode in t.modes:
                await closed_loop(session, t.urls, body_of[mode], mode == "stream", args.tp_concurrency,
                                  max_requests=2 * args.tp_concurrency, max_s=10,
                                  expect=expect, max_new=args.max_new_tokens)
        for t in targets:
            if t.pid:
                memory[t.name]["rss_mb_after_warmup"] = rss_mb(t.pid)
        for rep in range(0 if args.agentic_only else args.repeats):
            for mode in MODES:
                for phase, conc, max_req, max_s in phases:
                    cell_targets = [t for t in targets if mode in t.modes]
                    k = rep % len(cell_targets)
                    for t in cell_targets[k:] + cell_targets[:k]:
                        # A short warm-up at this concurrency, then the measured cell.
                        await closed_loop(session, t.urls, body_of[mode], mode == "stream", conc,
                                          max_requests=conc, max_s=2, expect=expect,
                                          max_new=args.max_new_tokens)
                        # CPU per request only where the machine is saturated (max rps).
                        cpu0 = cpu_now(t.pid, t.workers) if phase == "tp" else None
                        r = await closed_loop(session, t.urls, body_of[mode], mode == "stream", conc,
                                              max_requests=max_req, max_s=max_s, expect=expect,
                                              max_new=args.max_new_tokens)
                        if cpu0 is not None:
                            r.update(cpu_per_request(cpu0, cpu_now(t.pid, t.workers), r["n"]))
                        r.update(repeat=rep, mode=mode, phase=phase, concurrency=conc, target=t.name)
                        rows.append(r)
                        print(f"  rep {rep} {mode:9} {phase:5} C={conc:<3} {t.name:14} n={r['n']:5} "
                              f"rps={r['rps']:7.0f} p50={r['p50_ms']:7.2f}ms p99={r['p99_ms']:7.2f}ms",
                              flush=True)
        if args.agentic:
            # The interval-1 variant is a tiny-prompt streaming comparison only.
            agentic_targets = [t for t in targets if t.name != "pearl-interval1"]
            rows += await router_agentic.measure(session, agentic_targets, args)
    for t in targets:
        if t.pid:
            memory[t.name]["rss_mb_at_end"] = rss_mb(t.pid)
    return rows, memory


# ---- summary ----------------------------------------------------------------------------
def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize_runs(rows: list[dict[str, Any]], targets: list[Target]) -> dict[str, Any]:
    names = [t.name for t in targets]
    cells: dict[str, Any] = {}
    for mode in MODES:
        for phase in ("lat_c", "lat_1", "tp"):
            for name in names:
                rs = [r for r in rows if r["mode"] == mode and r["phase"] == phase and r["target"] == name]
                if not rs:
                    continue
                cell = {k: _med([r[k] for r in rs if k in r])
                        for k in ("rps", "p50_ms", "p99_ms", "mean_ms", "ttft_p50_ms", "chunks_mean",
                                  "router_cpu_us", "workers_cpu_us", "workers_busiest_over_mean")}
                cell["n_total"] = sum(r["n"] for r in rs)
                cell["repeats"] = len(rs)
                # Added latency vs direct: difference of percentiles, paired per repeat.
                if name != "direct":
                    for q in ("p50_ms", "p99_ms"):
                        diffs = []
                        for r in rs:
                            d = [x for x in rows if x["mode"] == mode and x["phase"] == phase
                                 and x["target"] == "direct" and x["repeat"] == r["repeat"]]
                            if d:
                                diffs.append(r[q] - d[0][q])
                        cell[f"added_{q}"] = _med(diffs)
                cells[f"{mode}/{phase}/{name}"] = {k: v for k, v in cell.items() if v is not None}
    ratios: dict[str, Any] = {}

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None
    for mode in MODES:
        for phase, keys in (("lat_c", ("p50_ms", "p99_ms")), ("lat_1", ("p50_ms", "p99_ms")), ("tp", ("rps",))):
            for key in keys:
                p = cells.get(f"{mode}/{phase}/pearl", {}).get(key)
                for other in ("direct", "sglang-router", "pearl-baseline"):
                    o = cells.get(f"{mode}/{phase}/{other}", {}).get(key)
                    r = ratio(p, o)
                    if r is not None:
                        ratios[f"{mode}/{phase}/{key}/pearl_over_{other}"] = r
    return {"cells": cells, "ratios": ratios}


def markdown(summary: dict[str, Any], targets: list[Target], args: argparse.Namespace) -> str:
    cells, ratios = summary["cells"], summary["ratios"]

    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)
    lines = [
        f"workers={args.workers} (emulator, profile tiny, time-scale {args.time_scale:g}), "
        f"max_new_tokens={args.max_new_tokens}, C={args.concurrency}, throughput C={args.tp_concurrency}, "
        f"repeats={args.repeats} (medians), cpus={os.cpu_count()}",
        "",
        "| mode | target | p50@C ms | p99@C ms | added p50@C | added p99@C | p50@1 ms | p99@1 ms "
        "| added p50@1 | max rps | stream chunks |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        for t in targets:
            lc = cells.get(f"{mode}/lat_c/{t.name}")
            if lc is None:
                continue
            l1 = cells.get(f"{mode}/lat_1/{t.name}", {})
            tp = cells.get(f"{mode}/tp/{t.name}", {})
            lines.append(
                f"| {mode} | {t.name} | {f(lc['p50_ms'])} | {f(lc['p99_ms'])} | {f(lc.get('added_p50_ms'), '+.2f')} "
                f"| {f(lc.get('added_p99_ms'), '+.2f')} | {f(l1.get('p50_ms'))} | {f(l1.get('p99_ms'))} "
                f"| {f(l1.get('added_p50_ms'), '+.2f')} | {f(tp.get('rps'), '.0f')} "
                f"| {f(lc.get('chunks_mean'), '.1f') if mode == 'stream' else '-'} |")
    lines += ["", "| ratio (PEARL / other) | mode | p50@C | p99@C | p50@1 | p99@1 | max rps |",
              "|---|---|---|---|---|---|---|"]
    for other in ("direct", "sglang-router", "pearl-baseline"):
        if not any(k.endswith(f"pearl_over_{other}") for k in ratios):
            continue
        for mode in MODES:
            def r(phase: str, key: str) -> str:
                return f(ratios.get(f"{mode}/{phase}/{key}/pearl_over_{other}"))
            lines.append(f"| vs {other} | {mode} | {r('lat_c', 'p50_ms')} | {r('lat_c', 'p99_ms')} "
                         f"| {r('lat_1', 'p50_ms')} | {r('lat_1', 'p99_ms')} | {r('tp', 'rps')} |")
    lines += ["", "added = router percentile minus direct percentile (difference of percentiles, "
              "median over repeats of the paired difference)."]
    lines += ["", "CPU per request in the max-rps cells (user + system, from each process's CPU clock, "
              "medians over repeats): the machine is saturated there, so these sums (with the load generator's) set the throughput "
              "ratios. Workers busiest / mean: the busiest worker's CPU "
              "over the workers' mean (1.00: the work was spread evenly).", "",
              "| mode | target | router CPU us/req | workers CPU us/req | together | workers busiest / mean |",
              "|---|---|---|---|---|---|"]
    for mode in MODES:
        for t in targets:
            tp = cells.get(f"{mode}/tp/{t.name}")
            if tp is None or "workers_cpu_us" not in tp:
                continue
            router, workers = tp.get("router_cpu_us"), tp["workers_cpu_us"]
            lines.append(f"| {mode} | {t.name} | {f(router, '.0f')} | {f(workers, '.0f')} "
                         f"| {f(workers + (router or 0.0), '.0f')} | {f(tp.get('workers_busiest_over_mean'))} |")
    return "\n".join(lines) + "\n"


# ---- processes --------------------------------------------------------------------------
def start_stack(args: argparse.Namespace, log_dir: Path, servers: list[ServerProcess]) -> list[Target]:
    py = sys.executable
    model_dir = log_dir / "model"
    from benchmarks.harness.tiny_model import TinyModelSpec, write_tiny_model
    write_tiny_model(model_dir, TinyModelSpec(arch="qwen2", max_position_embeddings=65536))
    env = {"PYTHONPATH": str(REPO)}

    def spawn(name: str, argv: list[str], port: int, extra_env: dict | None = None,
              health: str = "/health") -> ServerProcess:
        spec = ServerSpec(name=name, argv=argv, port=port, log_path=log_dir / f"{name}.log",
                          env={**env, **(extra_env or {})}, health_path=health)
        s = ServerProcess(spec)
        servers.append(s)
        return s.start()

    profile = "tiny"
    if args.agentic:  # room for 32K-token contexts
        base = json.loads((REPO / "pearl_sglang" / "emulator" / "profiles" / "tiny.json").read_text())
        profile = str(log_dir / "tiny-agentic.json")
        Path(profile).write_text(json.dumps({**base, **router_agentic.AGENTIC_PROFILE_OVERRIDES}))
    workers = []
    for i in range(args.workers):
        port = free_port()
        workers.append(spawn(f"worker{i}", [py, "-m", "pearl_sglang.emulator", "--host", "127.0.0.1",
                                            "--port", str(port), "--model-path", str(model_dir),
                                            "--profile", profile, "--time-scale", str(args.time_scale),
                                            "--seed", "0"], port))
    wait_all_healthy(workers, timeout=60)
    urls = [w.url for w in workers]
    pids = tuple(w.pid for w in workers)
    targets = [Target("direct", urls, workers=pids)]
    routers = []

    def pearl(name: str, interval: int | None, src: Path | None = None) -> ServerProcess:
        port = free_port()
        # -P: the checkout on PYTHONPATH, not the current directory, provides the router.
        argv = [py, "-P", "-m", "pearl_sglang.router", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "WARNING", "--worker-urls", *urls]
        if interval is not None:
            argv += ["--internal-stream-interval", str(interval)]
        return spawn(name, argv, port, health="/readiness", extra_env={"PYTHONPATH": str(src)} if src else None)

    p = pearl("pearl", None)
    routers.append(p)
    targets.append(Target("pearl", [p.url], pid=p.pid, workers=pids))
    if args.baseline_src is not None:  # the same router from another checkout: before/after, one run
        b = pearl("pearl-baseline", None, args.baseline_src)
        routers.append(b)
        targets.append(Target("pearl-baseline", [b.url], pid=b.pid, workers=pids))
    sgl = None
    if not args.no_sglang_router:
        try:
            stack = SglangCpuStack.load(STACK_DIR)
        except (OSError, ValueError, KeyError) as e:
            raise BenchError(f"sglang-router stack missing ({e}); run scripts/setup_sglang_cpu.sh "
                             f"or pass --no-sglang-router") from e
        port = free_port()
        sgl = spawn("sglang-router",
                    [stack.python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                     "--port", str(port), "--policy", "round_robin", "--prometheus-port", str(free_port()),
                     "--prometheus-host", "127.0.0.1", "--log-level", "warn", "--worker-urls", *urls],
                    port, extra_env=dict(stack.env), health="/readiness")
        routers.append(sgl)
        targets.append(Target("sglang-router", [sgl.url], pid=sgl.pid, workers=pids))
    if args.relay:  # the extra hop alone: what any userspace router adds before its own work
        port = free_port()
        relay = spawn("relay", [py, "-m", "benchmarks.harness.relay", "--port", str(port), "--upstream", *urls],
                      port)
        routers.append(relay)
        targets.append(Target("relay", [relay.url], pid=relay.pid, workers=pids))
    if args.interval1:
        p1 = pearl("pearl-interval1", 1)
        routers.append(p1)
        targets.append(Target("pearl-interval1", [p1.url], modes=("stream",), pid=p1.pid, workers=pids))
    wait_all_healthy(routers, timeout=120)
    if sgl is not None:
        _wait_sgl_workers(sgl.url, len(urls))
    return targets


def _wait_sgl_workers(url: str, n: int, timeout: float = 60.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/readiness", timeout=5) as r:
                if json.loads(r.read()).get("healthy_workers") == n:
                    return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"sglang-router did not register {n} healthy workers in {timeout:.0f}s")
        time.sleep(0.5)


def sglang_router_version() -> str | None:
    try:
        python = Path(SglangCpuStack.load(STACK_DIR).python)
    except (OSError, ValueError, KeyError):
        return None
    for d in (python.parents[1] / "lib").glob("python*/site-packages/sglang_router-*.dist-info"):
        return d.name[len("sglang_router-"):-len(".dist-info")]
    return None


# ---- main -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and repeats (~1.5 min)")
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument("--concurrency", type=positive_int, default=100, help="closed-loop clients for latency")
    ap.add_argument("--tp-concurrency", type=positive_int, default=256, help="closed-loop clients for max rps")
    ap.add_argument("--requests", type=positive_int, default=None,
                    help="requests per latency@C cell (default 1500, quick 400)")
    ap.add_argument("--repeats", type=positive_int, default=None, help="default 3, quick 2")
    ap.add_argument("--tp-seconds", type=positive_float, default=None, help="per throughput cell (default 4, quick 2)")
    ap.add_argument("--max-new-tokens", type=positive_int, default=16)
    ap.add_argument("--time-scale", type=positive_float, default=100.0, help="emulated seconds per real second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sglang-router", action="store_true")
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="also run PEARL's router from this checkout (target pearl-baseline), e.g. the "
                         "commit before a change, to compare before and after in one run")
    ap.add_argument("--no-relay", dest="relay", action="store_false",
                    help="skip the byte relay (target relay: the extra hop without a router's work)")
    ap.add_argument("--no-interval1", dest="interval1", action="store_false",
                    help="skip PEARL with --internal-stream-interval 1 (streaming only)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "router_overhead.json")
    ap.add_argument("--keep-logs", action="store_true", help="keep the server logs (path printed)")
    router_agentic.add_cli_args(ap)
    args = ap.parse_args(argv)
    router_agentic.finish_args(args)
    q = args.quick
    args.requests = args.requests or (400 if q else 1500)
    args.repeats = args.repeats or (2 if q else 3)
    args.tp_seconds = args.tp_seconds or (2.0 if q else 4.0)
    args.requests_c1 = 150 if q else 400
    args.c1_max_s = 1.5 if q else 3.0
    args.lat_max_s = 10.0 if q else 20.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    def on_term(signum, frame):  # stop the servers as on Ctrl-C
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    log_dir = Path(tempfile.mkdtemp(prefix="router_overhead-"))
    servers: list[ServerProcess] = []
    ok = False
    started = time.time()
    try:
        print(f"starting {args.workers} workers and the routers (logs: {log_dir})", flush=True)
        targets = start_stack(args, log_dir, servers)
        print(f"measuring: targets {[t.name for t in targets]}, repeats {args.repeats}", flush=True)
        rows, memory = asyncio.run(measure(targets, args))
        tiny_rows = [r for r in rows if "workload" not in r]
        summary = summarize_runs(tiny_rows, targets) if tiny_rows else {"cells": {}, "ratios": {}}
        md = markdown(summary, targets, args) if tiny_rows else ""
        if args.agentic:
            names = [t.name for t in targets if t.name != "pearl-interval1"]
            summary["agentic"] = router_agentic.summarize([r for r in rows if "workload" in r], names)
            md += "\n" + router_agentic.markdown(summary["agentic"], names, args)
        md += "\nRouter resident memory (MB) after warm-up -> at end: " + ", ".join(
            f"{name} {m.get('rss_mb_after_warmup') or 0:.0f} -> {m.get('rss_mb_at_end') or 0:.0f}"
            for name, m in memory.items()) + "\n"
        print()
        print(md)
        out = {
            "benchmark": "router_overhead",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "wall_s": round(time.time() - started, 1),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "environment": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                            "python": platform.python_version(), "aiohttp": aiohttp.__version__,
                            "sglang_router": sglang_router_version()},
            "targets": {t.name: t.urls for t in targets},
            "summary": summary,
            "router_memory": memory,
            "runs": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        args.out.with_suffix(".md").write_text("# Router overhead\n\n" + md)
        print(f"wrote {args.out} and {args.out.with_suffix('.md')} ({time.time() - started:.0f} s)")
        ok = True
        return 0
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        for s in servers:
            if not s.alive():
                print(f"--- {s.spec.name} exited:\n{s.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        for s in reversed(servers):
            s.stop(grace=5.0)
        if ok and not args.keep_logs:
            for p in sorted(log_dir.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            log_dir.rmdir()
        elif not ok:
            print(f"server logs kept in {log_dir}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
