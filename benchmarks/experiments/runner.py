"""Run many replays in parallel processes, with a per-run cache and progress lines."""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from benchmarks.harness.replay import ReplayConfig, replay
from pearl_sglang.core.telemetry import ProfileFit
from pearl_sglang.workload.presets import DEFAULT_PRESET, available_presets

RESULTS = Path(__file__).resolve().parents[1] / "results"


def arg_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The options every experiment takes: ``--quick`` and ``--parallel``."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.experiments {name}", description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a reduced run, into results/<experiment>-quick/")
    parser.add_argument("--parallel", type=int, default=2, help="replays run at once (processes)")
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=available_presets(),
                        help="workload and worker profiles; results of another than the default go to "
                             "results/<experiment>[-quick]-<preset>/")
    return parser


def results_name(name: str, *, quick: bool, preset: str) -> str:
    """``ratio``, ``ratio-quick``, ``ratio-env-bound``: one folder per variant and regime."""
    return name + ("-quick" if quick else "") + ("" if preset == DEFAULT_PRESET else f"-{preset}")


@dataclass(frozen=True)
class Job:
    name: str            # unique within an experiment; the cache file's stem
    config: ReplayConfig


def add_profile_fit(parser: argparse.ArgumentParser) -> None:
    """``--profile-fit``: the cluster's ``profile_fit`` in every replay of the experiment."""
    parser.add_argument("--profile-fit", default=ProfileFit.ALL.value, choices=[f.value for f in ProfileFit],
                        help="the cluster's profile_fit in every replay (placement and decisions use the "
                             "profile); other than 'all', results go to results/<experiment>-profile-fit-<value>/")


def with_profile_fit(name: str, jobs: list[Job], fit: str) -> tuple[str, list[Job]]:
    """The results folder and the jobs for ``--profile-fit fit`` (unchanged for 'all')."""
    if fit == ProfileFit.ALL.value:
        return name, jobs
    return f"{name}-profile-fit-{fit}", [
        Job(j.name, replace(j.config, cluster_overrides={**j.config.cluster_overrides, "profile_fit": fit}))
        for j in jobs]


# Fields left out of the cache key at their defaults, so runs cached before they existed
# stay valid: ones that change how a replay is computed, not its results (tested), and
# options added later whose default is what every earlier run did.
_RESULT_NEUTRAL = {"engine_stepping": "stretch", "router": {}, "engine_args": (), "carry_over_share": None,
                   "turns_hint_sigma": None}


def _key(config: ReplayConfig) -> str:
    fields = {k: v for k, v in asdict(config).items() if _RESULT_NEUTRAL.get(k, object()) != v}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _run_one(config: ReplayConfig) -> dict[str, Any]:
    return replay(config, verbose=False)


def _line(result: dict[str, Any]) -> str:
    s, run = result["summary"], result["run"]
    answers = result["trace"].get("answers")
    checked = f"{answers['joins'] + answers['leaves']} trace answers checked, " if answers else ""
    return (f"{s['steps']} steps, {s['mean_throughput_tok_s']:.0f} tok/s, errors {s['errors']}, {checked}"
            f"{run['virtual_s'] / 60:.0f} virtual min in {run['real_s']:.0f} s")


def run_jobs(experiment: str, jobs: list[Job], *, parallel: int = 2, fresh: bool = False,
             cache_dir: str | None = None) -> dict[str, dict[str, Any]]:
    """Results by job name. A cached run is reused when its configuration is unchanged;
    experiments that share runs (the four fixed-resource ones) share ``cache_dir``.

    Under ``plan_jobs`` nothing runs: the jobs are recorded and the experiment stops here."""
    cache = RESULTS / (cache_dir or experiment) / "runs"
    if _planned is not None:
        _planned.append((experiment, cache, jobs))
        raise _PlanOnly
    results, todo = _cached(cache, jobs, fresh)
    print(f"[{experiment}] {len(jobs)} runs, {len(results)} cached, {len(todo)} to run on {parallel} processes",
          flush=True)
    results.update(_execute(experiment, [(job, [cache / f"{job.name}.json"]) for job in todo], parallel,
                            done=len(results), total=len(jobs)))
    return results


# ---- running several experiments' replays in one pool (``experiments all``) -----------
class _PlanOnly(Exception):
    """Raised by ``run_jobs`` under ``plan_jobs`` once an experiment's jobs are known."""


_planned: list[tuple[str, Path, list[Job]]] | None = None


def plan_jobs(main: Callable[[list[str]], int], argv: list[str]) -> list[tuple[str, Path, list[Job]]]:
    """The jobs an experiment's ``main(argv)`` would run, running none: ``run_jobs``
    records them and stops ``main`` there (so ``main`` must reach a ``run_jobs`` call)."""
    global _planned
    _planned = collected = []
    try:
        main(argv)
    except _PlanOnly:
        pass
    finally:
        _planned = None
    return collected


def run_all(planned: list[tuple[str, Path, list[Job]]], *, parallel: int = 2) -> None:
    """Run the uncached jobs of several experiments in one pool, the longest first, so no
    process idles at the end of each experiment; the experiments then find them cached.
    Jobs of the same configuration (under any name, in any experiment's cache) run once."""
    by_key: dict[str, tuple[Job, list[Path]]] = {}
    for _, cache, jobs in planned:
        for job in _cached(cache, jobs, fresh=False)[1]:
            paths = by_key.setdefault(_key(job.config), (job, []))[1]
            if (path := cache / f"{job.name}.json") not in paths:
                paths.append(path)
    todo = sorted(by_key.values(), key=lambda e: -_expected_cost(e[0].config))
    print(f"[all] {len(todo)} runs to do on {parallel} processes", flush=True)
    _execute("all", todo, parallel, done=0, total=len(todo))


def _expected_cost(config: ReplayConfig) -> float:
    """Relative CPU cost of a replay: trajectories times steps (a step is ~8 minutes)."""
    steps = config.steps if config.steps is not None else config.minutes / 8
    return config.batch_size * steps


# ---- shared by both ------------------------------------------------------------------------
def _cached(cache: Path, jobs: list[Job], fresh: bool) -> tuple[dict[str, dict[str, Any]], list[Job]]:
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
    return results, todo


def _execute(label: str, todo: list[tuple[Job, list[Path]]], parallel: int, *, done: int,
             total: int) -> dict[str, dict[str, Any]]:
    """Run ``todo`` in ``parallel`` processes, writing each result to its cache files as it
    finishes."""
    results: dict[str, dict[str, Any]] = {}
    if not todo:
        return results
    failed: list[str] = []
    t0 = time.perf_counter()
    # A fresh process per replay: nothing inherited from the parent's loop, and nothing
    # left over from earlier replays (one pool running ~50 replays per process grew to
    # 2 GiB, and its later replays took ~35% more CPU than with a pool per experiment).
    # Each is forked from a server that imported the harness once and runs no replay, so
    # a replay does not pay the imports (~1 CPU-second, ~10% of a short replay).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["benchmarks.harness.replay"])
    with ProcessPoolExecutor(max_workers=parallel, mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = {pool.submit(_run_one, job.config): (job, paths) for job, paths in todo}
        for fut in as_completed(futures):
            job, paths = futures[fut]
            try:
                result = fut.result()
            except Exception as e:  # keep the other runs going; report them all at the end
                failed.append(f"{job.name}: {e!r}")
                print(f"[{label}] FAILED {job.name}: {e!r}", file=sys.stderr, flush=True)
                continue
            result["cache_key"] = _key(job.config)
            text = json.dumps(result, default=str)
            for path in paths:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            results[job.name] = result
            done += 1
            print(f"[{label}] {done}/{total} {job.name}: {_line(result)} "
                  f"({time.perf_counter() - t0:.0f} s so far)", file=sys.stderr, flush=True)
    if failed:
        raise RunsFailed(f"{len(failed)} of {total} runs failed (the others are cached):\n" + "\n".join(failed))
    return results


class RunsFailed(RuntimeError):
    """Some replays raised; the finished ones are cached, so a rerun does only the rest."""
