"""``python -m benchmarks.experiments {all|scaling|elastic|pd-sweep|ratio|ablation|sensitivity|stragglers|decision-quality|reconfig} [--quick] [--preset NAME]``"""
from __future__ import annotations

import importlib
import sys
import time

from benchmarks.experiments import runner

EXPERIMENTS = {
    "scaling": "benchmarks.experiments.scaling",
    "pd-sweep": "benchmarks.experiments.pd_sweep",
    "ratio": "benchmarks.experiments.ratio",
    "elastic": "benchmarks.experiments.elastic",
    "ablation": "benchmarks.experiments.ablation",
    "sensitivity": "benchmarks.experiments.sensitivity",
    "stragglers": "benchmarks.experiments.stragglers",
    "decision-quality": "benchmarks.experiments.decision_quality",
    "reconfig": "benchmarks.reconfiguration_cost",
}
REPLAYS = ("scaling", "pd-sweep", "ratio", "elastic", "ablation", "sensitivity", "stragglers",
           "decision-quality")  # built on runner.run_jobs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in (*EXPERIMENTS, "all"):
        print(__doc__.strip() + "\n\nexperiments: " + ", ".join(EXPERIMENTS), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    name, rest = argv[0], argv[1:]
    names = list(EXPERIMENTS) if name == "all" else [name]
    if name == "all":  # every experiment's replays in one pool; each then finds its runs cached
        t0 = time.perf_counter()
        print("== replays of every experiment ==", flush=True)
        parallel = runner.arg_parser("all", __doc__).parse_known_args(rest)[0].parallel
        runner.run_all([p for n in names if n in REPLAYS
                        for p in runner.plan_jobs(importlib.import_module(EXPERIMENTS[n]).main, rest)],
                       parallel=parallel)
        print(f"== replays: done in {time.perf_counter() - t0:.0f} s ==", flush=True)
    for n in names:
        t0 = time.perf_counter()
        print(f"== {n} ==", flush=True)
        rc = importlib.import_module(EXPERIMENTS[n]).main(rest)
        print(f"== {n}: done in {time.perf_counter() - t0:.0f} s ==", flush=True)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
