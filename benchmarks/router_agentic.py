"""Agentic request sizes for ``router_overhead.py``: long ``input_ids`` prompts and
multi-turn trajectories, PEARL's router against sglang-router over the same workers.

Workloads (each non-streaming and streaming):

  4k, 32k     single requests with 4,096- / 32,768-token ``input_ids`` prompts (16 distinct
              prompts, cycled; the workers' prefix cache holds them after the first round);
  multiturn   trajectories of TURNS turns whose prompts extend the previous turn's (a
              1,024-token start, +512 tokens a turn, up to ~4.6K), sent one turn after the
              other with ``X-Pearl-Trajectory-Id``: PEARL's prefix affinity keys every turn
              (sglang-router runs ``round_robin``, so it does no affinity work at all).

Phases: ``lat_1`` (one client, nothing queues: the added p50 is the router's own cost per
request; each body goes to every target in turn, ``one_client_interleaved``, with each
router's CPU per request of its own) and ``tp`` (closed loop at ``--agentic-concurrency``
clients for a fixed time: requests per second). Before either, every worker's prefix cache
gets every prompt, so no target's latency depends on which worker held a prompt. With the
``relay`` target (``harness/relay.py``, a byte relay: the extra hop without a router's
work) the table adds PEARL's p50 over the relay's: the router's own work on the path.
Cells run interleaved, target order rotated per repeat; reported
numbers are medians over repeats, and the ratio PEARL / sglang-router is taken per repeat
(the two ran back to back) before the median. Every reply is checked like the tiny
prompts' (16 output ids, identical across targets, streams end with ``[DONE]``).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import aiohttp

from benchmarks.harness.cli_args import positive_int
from benchmarks.harness.process_cpu import cpu_now, cpu_per_request, process_cpu_ns
from benchmarks.harness.worker_counters import read_counters, spread

TRAJECTORY_HEADER = "X-Pearl-Trajectory-Id"
SIZES = {"4k": 4096, "32k": 32768}
DISTINCT = 16          # distinct single prompts, cycled
TURNS = 8
FIRST_TURN = 1024
TURN_GROWTH = 512
MODES = ("nonstream", "stream")

# The emulator's tiny profile with room for 32K-token contexts: the same per-token costs,
# larger limits, and 64-token cache pages (the workers' own Python work per prompt stays
# small next to the routers', which is what is measured).
AGENTIC_PROFILE_OVERRIDES = {
    "name": "tiny-agentic", "context_length": 65536, "max_total_tokens": 1 << 22,
    "chunked_prefill_size": 65536, "max_prefill_tokens": 1 << 20, "cache_page_tokens": 64,
}


@dataclass(frozen=True)
class Workload:
    """``sequences``: request bodies sent one after another by one client task (a
    trajectory's turns, or a single request)."""

    name: str
    mode: str
    sequences: tuple[tuple[bytes, ...], ...]
    trajectory: bool


def request_body(ids: list[int], stream: bool, max_new: int) -> bytes:
    """A turn's ``/generate`` body as every router benchmark sends it (compact JSON)."""
    return json.dumps({"input_ids": ids, "stream": stream,
                       "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}},
                      separators=(",", ":")).encode()


def build_workloads(names: list[str], *, seed: int, max_new: int) -> list[Workload]:
    rng = random.Random(seed + 1)
    out = []
    for name in names:
        if name in SIZES:
            prompts = [[[rng.randrange(3, 1000) for _ in range(SIZES[name])]] for _ in range(DISTINCT)]
        elif name == "multiturn":
            prompts = []
            for _ in range(DISTINCT):
                ids = [rng.randrange(3, 1000) for _ in range(FIRST_TURN + TURN_GROWTH * (TURNS - 1))]
                prompts.append([ids[:FIRST_TURN + TURN_GROWTH * t] for t in range(TURNS)])
        else:
            raise ValueError(f"unknown agentic workload {name!r}; known: {[*SIZES, 'multiturn']}")
        for mode in MODES:  # the same prompts in both modes: their replies must match
            seqs = tuple(tuple(request_body(p, mode == "stream", max_new) for p in seq) for seq in prompts)
            out.append(Workload(name, mode, seqs, trajectory=name == "multiturn"))
    return out


async def _send(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool,
                headers: dict[str, str]) -> tuple[float, dict | None]:
    t0 = time.perf_counter()
    async with session.post(url + "/generate", data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        if not stream:
            final = json.loads(await resp.read())
        else:
            final, last = None, b""
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                last = line[5:].strip()
                if last == b"[DONE]":
                    break
                final = last
            if last != b"[DONE]":
                raise RuntimeError(f"{url}: stream ended without [DONE]")
            final = json.loads(final) if final else None
    return time.perf_counter() - t0, final


_cell_ids = itertools.count()


def _check(w: Workload, key: tuple, final: dict | None, expect: dict, max_new: int, via: str) -> None:
    """A reply has exactly ``max_new`` output ids, the same from every target."""
    ids = (final or {}).get("output_ids")
    if not isinstance(ids, list) or len(ids) != max_new or expect.setdefault(key, ids) != ids:
        raise RuntimeError(f"{w.name} {key} via {via}: output ids {ids!r:.200} differ or are not {max_new} long "
                           f"(another target's: {expect.get(key)!r:.200}; the reply: {final!r:.300})")


def _cell(lats: list[float], elapsed: float, cpu0, cpu1) -> dict[str, Any]:
    """Percentiles, requests per second over ``elapsed``, and CPU per request: the
    router's own (load-independent), its workers' together and the busiest worker's over
    their mean (how evenly the work was spread), where the processes could be read."""
    s = sorted(lats)
    out = {"n": len(s), "elapsed_s": elapsed, "rps": len(s) / elapsed,
           "p50_ms": s[len(s) // 2] * 1e3, "p99_ms": s[min(len(s) - 1, int(0.99 * len(s)))] * 1e3}
    cpu = cpu_per_request(cpu0, cpu1, len(s))
    if "router_cpu_us" in cpu:
        out["router_cpu_ms_per_req"] = cpu["router_cpu_us"] / 1e3
    for name in ("workers_cpu_us", "workers_busiest_over_mean"):
        if name in cpu:
            out[name] = cpu[name]
    return out


async def closed_loop(session: aiohttp.ClientSession, urls: list[str], w: Workload, concurrency: int, *,
                      max_requests: int, max_s: float, expect: dict, max_new: int,
                      pid: int | None = None, workers: Sequence[int] = (),
                      worker_urls: Sequence[str] = ()) -> dict[str, Any]:
    """C tasks each take the next sequence and send its bodies one after another.
    ``worker_urls``: the workers behind ``urls``, whose own counters say where the
    cell's requests went and how much of their prompts the caches held."""
    rr = itertools.cycle(urls)
    seq_counter = itertools.count()
    sent = itertools.count()
    lats: list[float] = []
    cell = next(_cell_ids)
    stream = w.mode == "stream"
    deadline = time.perf_counter() + max_s

    async def client() -> None:
        while time.perf_counter() < deadline:
            s = next(seq_counter)
            seq = w.sequences[s % len(w.sequences)]
            headers = {"Content-Type": "application/json"}
            if w.trajectory:  # a fresh trajectory id per run of a trajectory
                headers[TRAJECTORY_HEADER] = f"{w.name}-{cell}-{s}"
            url = next(rr)
            for turn, body in enumerate(seq):
                if next(sent) >= max_requests or time.perf_counter() >= deadline:
                    return
                lat, final = await _send(session, url, body, stream, headers)
                lats.append(lat)
                _check(w, (w.name, s % len(w.sequences), turn), final, expect, max_new, url)

    counted0 = await read_counters(session, worker_urls)
    t0, cpu0 = time.perf_counter(), cpu_now(pid, workers)
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed, cpu1 = time.perf_counter() - t0, cpu_now(pid, workers)
    if not lats:
        raise RuntimeError(f"{w.name}: no request completed")
    return {**_cell(lats, elapsed, cpu0, cpu1), **spread(counted0, await read_counters(session, worker_urls))}


async def one_client_interleaved(session: aiohttp.ClientSession, targets: list, w: Workload, *,
                                 max_requests: int, max_s: float, expect: dict, max_new: int,
                                 ) -> dict[str, dict[str, Any]]:
    """One client, nothing queued anywhere, the targets taken in turn request by request:
    each body goes to every target (order rotated per body) before the next one, so a
    stretch of machine noise falls on all of them alike; timed back to back in separate
    cells, the same target's p50 moved by up to 0.5 ms between cells on this machine.
    A target's ``rps`` is its requests over the time spent in them (1 / mean latency); its
    ``router_cpu_ms_while_waited`` the router's CPU (all threads) between sending each
    request and reading its answer, per request: how much of the turn's time the router was
    computing (what it does once the client has the answer is mostly left out)."""
    lats: dict[str, list[float]] = {t.name: [] for t in targets}
    waited_cpu_ns = {t.name: 0 for t in targets}  # the router's CPU while its client waited
    rr = {t.name: itertools.cycle(t.urls) for t in targets}
    cell = next(_cell_ids)
    stream = w.mode == "stream"
    cpu0 = {t.name: cpu_now(t.pid) for t in targets}
    deadline = time.perf_counter() + max_s
    sent = s = 0
    while sent < max_requests and time.perf_counter() < deadline:
        seq = w.sequences[s % len(w.sequences)]
        url = {t.name: next(rr[t.name]) for t in targets}
        for turn, body in enumerate(seq):
            if sent >= max_requests or time.perf_counter() >= deadline:
                break
            k = sent % len(targets)
            for t in targets[k:] + targets[:k]:
                headers = {"Content-Type": "application/json"}
                if w.trajectory:  # each target's own id for this run of the trajectory
                    headers[TRAJECTORY_HEADER] = f"{w.name}-{cell}-{s}-{t.name}"
                before = process_cpu_ns(t.pid)
                lat, final = await _send(session, url[t.name], body, stream, headers)
                after = process_cpu_ns(t.pid)
                if before is not None and after is not None:
                    waited_cpu_ns[t.name] += after - before
                lats[t.name].append(lat)
                _check(w, (w.name, s % len(w.sequences), turn), final, expect, max_new, t.name)
            sent += 1
        s += 1
    cells = {t.name: _cell(lats[t.name], sum(lats[t.name]), cpu0[t.name], cpu_now(t.pid)) for t in targets}
    for t in targets:
        if t.pid is not None and lats[t.name]:
            cells[t.name]["router_cpu_ms_while_waited"] = waited_cpu_ns[t.name] / 1e6 / len(lats[t.name])
    return cells


async def measure(session: aiohttp.ClientSession, targets: list, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``targets``: router_overhead's Target objects (name, urls)."""
    workloads = build_workloads(args.agentic, seed=args.seed, max_new=args.max_new_tokens)
    expect: dict = {}
    rows: list[dict[str, Any]] = []
    phases = [("lat_1", 1, args.agentic_c1_requests, args.agentic_c1_s),
              ("tp", args.agentic_concurrency, 10 ** 9, args.agentic_tp_s)]
    # Every worker's prefix cache gets every prompt first, so that no target's latency
    # depends on which worker happened to hold a prompt: an uncached 32K-token prefill
    # costs the tiny profile ~6.5 ms at time-scale 100, more than what is measured here.
    worker_urls = next(t.urls for t in targets if t.name == "direct")
    for w in workloads:  # warm: every worker, then every target, every prompt once
        for url in worker_urls:
            await closed_loop(session, [url], w, args.agentic_concurrency,
                              max_requests=sum(map(len, w.sequences)), max_s=30, expect=expect,
                              max_new=args.max_new_tokens)
        for t in targets:
            await closed_loop(session, t.urls, w, args.agentic_concurrency,
                              max_requests=sum(map(len, w.sequences)), max_s=30, expect=expect,
                              max_new=args.max_new_tokens)
    for rep in range(args.repeats):
        for w in workloads:
            for phase, conc, max_req, max_s in phases:
                k = rep % len(targets)
                rotated = targets[k:] + targets[:k]
                if phase == "lat_1":
                    cells = await one_client_interleaved(session, rotated, w, max_requests=max_req, max_s=max_s,
                                                         expect=expect, max_new=args.max_new_tokens)
                else:
                    cells = {t.name: await closed_loop(session, t.urls, w, conc, max_requests=max_req, max_s=max_s,
                                                       expect=expect, max_new=args.max_new_tokens, pid=t.pid,
                                                       workers=t.workers, worker_urls=worker_urls)
                             for t in rotated}
                for t in rotated:
                    r = cells[t.name]
                    r.update(repeat=rep, workload=w.name, mode=w.mode, phase=phase, concurrency=conc,
                             target=t.name)
                    rows.append(r)
                    print(f"  rep {rep} {w.name:9} {w.mode:9} {phase:5} C={conc:<3} {t.name:14} n={r['n']:5} "
                          f"rps={r['rps']:7.1f} p50={r['p50_ms']:7.2f}ms p99={r['p99_ms']:7.2f}ms "
                          f"cpu/req={r.get('router_cpu_ms_per_req', 0):6.2f}ms"
                          + (f" requests/worker={'/'.join(f'{x:.2f}' for x in r['workers_request_shares'])}"
                             f" cache hits={r.get('workers_cache_hit_share', 0):.0%}"
                             if "workers_request_shares" in r else ""), flush=True)
    return rows


def summarize(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per (workload, mode): each target's median rps and p50@1; PEARL's added p50@1 over
    direct and its rps / p50 ratios over each other target, paired per repeat."""
    out: dict[str, Any] = {}
    keys = sorted({(r["workload"], r["mode"]) for r in rows}, key=lambda k: (k[0], MODES.index(k[1])))

    def get(wl: str, mode: str, phase: str, target: str, rep: int) -> dict | None:
        for r in rows:
            if (r["workload"], r["mode"], r["phase"], r["target"], r["repeat"]) == (wl, mode, phase, target, rep):
                return r
        return None
    reps = sorted({r["repeat"] for r in rows})
    for wl, mode in keys:
        cell: dict[str, Any] = {}
        for name in names:
            tp = [r["rps"] for rep in reps if (r := get(wl, mode, "tp", name, rep))]
            p50 = [r["p50_ms"] for rep in reps if (r := get(wl, mode, "lat_1", name, rep))]
            if not tp:
                continue
            c: dict[str, Any] = {"rps": statistics.median(tp), "p50_1_ms": statistics.median(p50)}
            for field, to in (("router_cpu_ms_per_req", "cpu_ms_per_req"), ("workers_cpu_us", "workers_cpu_us"),
                              ("workers_busiest_over_mean", "workers_busiest_over_mean"),
                              ("workers_requests_busiest_over_mean", "workers_requests_busiest_over_mean"),
                              ("workers_cache_hit_share", "workers_cache_hit_share")):
                got = [r[field] for rep in reps if (r := get(wl, mode, "tp", name, rep)) and field in r]
                if got:
                    c[to] = statistics.median(got)
            waited = [r["router_cpu_ms_while_waited"] for rep in reps
                      if (r := get(wl, mode, "lat_1", name, rep)) and "router_cpu_ms_while_waited" in r]
            if waited:
                c["cpu_ms_while_waited_1"] = statistics.median(waited)
            if name != "direct":
                added = [a["p50_ms"] - d["p50_ms"] for rep in reps
                         if (a := get(wl, mode, "lat_1", name, rep)) and (d := get(wl, mode, "lat_1", "direct", rep))]
                if added:
                    c["added_p50_1_ms"] = statistics.median(added)
            cell[name] = c
        # PEARL's own work: its p50@1 over the byte relay's (the same extra hop, no work).
        own = [p["p50_ms"] - o["p50_ms"] for rep in reps
               if (p := get(wl, mode, "lat_1", "pearl", rep)) and (o := get(wl, mode, "lat_1", "relay", rep))]
        if own:
            cell.setdefault("pearl", {})["over_relay_p50_1_ms"] = statistics.median(own)
        for other in names:
            if other in ("pearl", "direct"):
                continue
            ratios = [p["rps"] / o["rps"] for rep in reps
                      if (p := get(wl, mode, "tp", "pearl", rep)) and (o := get(wl, mode, "tp", other, rep))]
            if ratios:
                cell.setdefault("pearl", {})[f"rps_over_{other}"] = statistics.median(ratios)
        out[f"{wl}/{mode}"] = cell
    return out


def _per_target(summary: dict[str, Any], names: list[str]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(workload, mode, target, the target's figures) for every target of every cell."""
    for key, cell in summary.items():
        wl, mode = key.split("/")
        for n in names:
            yield wl, mode, n, cell.get(n, {})


def markdown(summary: dict[str, Any], names: list[str], args: argparse.Namespace) -> str:
    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)
    others = [n for n in names if n not in ("pearl", "direct")]
    lines = [f"Agentic sizes: throughput at C={args.agentic_concurrency}, added p50 at C=1 (router p50 - "
             f"direct p50), repeats={args.repeats} (medians; ratios paired per repeat); CPU ms/req: the "
             f"router process's user+system CPU per request in the throughput cell (all threads)", "",
             "| workload | mode | " + " | ".join(f"{n} rps" for n in names) + " | "
             + " | ".join(f"PEARL / {o} rps" for o in others) + " | "
             + " | ".join(f"{n} added p50@1 ms" for n in names if n != "direct") + " | "
             + " | ".join(f"{n} CPU ms/req" for n in names if n != "direct") + " |"
             + (" PEARL p50@1 - relay p50@1 ms |" if "relay" in names else ""),
             "|" + "---|" * (2 + len(names) + len(others) + 2 * (len(names) - ("direct" in names))
                             + ("relay" in names))]
    for key, cell in summary.items():
        wl, mode = key.split("/")
        row = [wl, mode] + [f(cell.get(n, {}).get("rps"), ".0f") for n in names]
        row += [f(cell.get("pearl", {}).get(f"rps_over_{o}")) for o in others]
        row += [f(cell.get(n, {}).get("added_p50_1_ms"), "+.2f") for n in names if n != "direct"]
        row += [f(cell.get(n, {}).get("cpu_ms_per_req"), ".2f") for n in names if n != "direct"]
        if "relay" in names:
            row.append(f(cell.get("pearl", {}).get("over_relay_p50_1_ms"), "+.2f"))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "One client, by its parts: the router's CPU (all threads, exact: its process CPU clock) between "
              "sending each request and reading its answer, per request, beside the added p50 at one client "
              "and the router's CPU per request in the throughput cell (turns back to back); medians over "
              "repeats:", "",
              "| workload | mode | target | added p50@1 ms | router CPU while the client waited, ms/req "
              "| router CPU ms/req, throughput cell | one client / throughput cell |",
              "|---|---|---|---|---|---|---|"]
    for wl, mode, n, c in _per_target(summary, names):
        waited, warm = c.get("cpu_ms_while_waited_1"), c.get("cpu_ms_per_req")
        if waited is not None:
            lines.append(f"| {wl} | {mode} | {n} | {f(c.get('added_p50_1_ms'), '+.2f')} | {f(waited)} | {f(warm)} | "
                         f"{f(None if not warm else waited / warm, '.1f')} |")
    lines += ["", "Where the work went in the throughput cells (CPU per request from each process's CPU "
              "clock, medians over repeats; workers busiest / mean: the busiest worker's CPU over the workers' mean, 1.00 when "
              "the router spread the work evenly; requests busiest / mean the same of the requests each worker "
              "counted, and cache hits the share of prompt tokens the workers found cached, both from the "
              "workers' own `/metrics`):", "",
              "| workload | mode | target | router CPU ms/req | workers CPU ms/req | workers busiest / mean "
              "| requests busiest / mean | cache hits |",
              "|---|---|---|---|---|---|---|---|"]
    for wl, mode, n, c in _per_target(summary, names):
        workers, hits = c.get("workers_cpu_us"), c.get("workers_cache_hit_share")
        lines.append(f"| {wl} | {mode} | {n} | {f(c.get('cpu_ms_per_req'))} | "
                     f"{f(None if workers is None else workers / 1e3)} | {f(c.get('workers_busiest_over_mean'))} | "
                     f"{f(c.get('workers_requests_busiest_over_mean'))} | "
                     f"{'-' if hits is None else format(hits, '.1%')} |")
    return "\n".join(lines) + "\n"


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--agentic", nargs="*", default=None, metavar="WORKLOAD",
                    help="also measure agentic sizes: any of 4k 32k multiturn (no names: all three)")
    ap.add_argument("--agentic-only", action="store_true", help="skip the tiny-prompt grid")
    ap.add_argument("--agentic-concurrency", type=positive_int, default=64, help="closed-loop clients for rps")
    ap.add_argument("--agentic-tp-s", type=float, default=None, help="per throughput cell (default 4, quick 2)")


def finish_args(args: argparse.Namespace) -> None:
    if args.agentic_only and args.agentic is None:
        args.agentic = []
    if args.agentic is not None and not args.agentic:
        args.agentic = [*SIZES, "multiturn"]
    args.agentic_tp_s = args.agentic_tp_s or (2.0 if args.quick else 4.0)
    args.agentic_c1_requests = 120 if args.quick else 400  # bodies, each sent to every target
    args.agentic_c1_s = 4.0 if args.quick else 12.0
