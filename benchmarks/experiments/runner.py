"""Run many replays in parallel processes, with a per-run cache and progress lines."""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.replay import ReplayConfig, replay

RESULTS = Path(__file__).resolve().parents[1] / "results"


def arg_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The options every experiment takes: ``--quick`` and ``--parallel``."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.experiments {name}", description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a reduced run, into results/<experiment>-quick/")
    parser.add_argument("--parallel", type=int, default=2, help="replays run at once (processes)")
    return parser


@dataclass(frozen=True)
class Job:
    name: str            # unique within an experiment; the cache file's stem
    config: ReplayConfig


def _key(config: ReplayConfig) -> str:
    return hashlib.sha256(json.dumps(asdict(config), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _run_one(config: ReplayConfig) -> dict[str, Any]:
    return replay(config, verbose=False)


def _line(result: dict[str, Any]) -> str:
    s, run = result["summary"], result["run"]
    return (f"{s['steps']} steps, {s['mean_throughput_tok_s']:.0f} tok/s, errors {s['errors']}, "
            f"{run['virtual_s'] / 60:.0f} virtual min in {run['real_s']:.0f} s")


def run_jobs(experiment: str, jobs: list[Job], *, parallel: int = 2, fresh: bool = False,
             cache_dir: str | None = None) -> dict[str, dict[str, Any]]:
    """Results by job name. A cached run is reused when its configuration is unchanged;
    experiments that share runs (the PD sweep and ratio selection) share ``cache_dir``."""
    cache = RESULTS / (cache_dir or experiment) / "runs"
    cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    todo: list[Job] = []
    for job in jobs:
        path = cache / f"{job.name}.json"
        if not fresh and path.exists():
            data = json.loads(path.read_text())
            if data.get("cache_key") == _key(job.config):
                results[job.name] = data
                continue
        todo.append(job)
    done, total, t0 = len(results), len(jobs), time.perf_counter()
    print(f"[{experiment}] {total} runs, {done} cached, {len(todo)} to run on {parallel} processes", flush=True)
    if not todo:
        return results
    failed: list[str] = []
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no inherited loop
    with ProcessPoolExecutor(max_workers=parallel, mp_context=ctx) as pool:
        futures = {pool.submit(_run_one, job.config): job for job in todo}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                result = fut.result()
            except Exception as e:  # keep the other runs going; report them all at the end
                failed.append(f"{job.name}: {e!r}")
                print(f"[{experiment}] FAILED {job.name}: {e!r}", file=sys.stderr, flush=True)
                continue
            result["cache_key"] = _key(job.config)
            (cache / f"{job.name}.json").write_text(json.dumps(result, default=str))
            results[job.name] = result
            done += 1
            print(f"[{experiment}] {done}/{total} {job.name}: {_line(result)} "
                  f"({time.perf_counter() - t0:.0f} s so far)", file=sys.stderr, flush=True)
    if failed:
        raise RunsFailed(f"{len(failed)} of {total} runs failed (the others are cached):\n" + "\n".join(failed))
    return results


class RunsFailed(RuntimeError):
    """Some replays raised; the finished ones are cached, so a rerun does only the rest."""
