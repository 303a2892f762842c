"""CPU seconds of one segment replay, two checkouts alternated in one run.

On a shared, loaded machine wall time says little and even CPU seconds drift over an
hour, so the two checkouts run alternately (A B A B ... per run kind) and each replay's
CPU is the child process's user + system time (``os.wait4``'s rusage), not wall time.
Each pair's results are compared too: steps, summary and topology samples must be equal
to the digit, since the change measured is meant to change how fast, never what.
``--parallel N`` runs N replays at once, each pair's two started together, so both see the
same host.

    .venv/bin/python benchmarks/replay_cpu.py --before /tmp/old --after . \
        [--runs pearl:qwen3-8b roll:qwen3-8b] [--segment 1] [--minutes 120] [--repeat 1] [--parallel 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

RUNS = ("pearl:qwen3-8b", "roll:qwen3-8b", "pearl:qwen3-30b-a3b", "roll:qwen3-30b-a3b")
_COMPARED = ("steps", "summary", "samples")


def run_replay(checkout: Path, system: str, model: str, *, segment: int, minutes: float,
               out: Path, extra: list[str]) -> dict[str, Any]:
    """One replay in a child process of ``checkout``; its CPU and real seconds and result."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [str(checkout / ".venv/bin/python"), "-m", "benchmarks.harness.replay", "--system", system,
            "--model", model, "--segment", str(segment), "--minutes", f"{minutes:g}", "--quiet",
            "--out", str(out), *extra]
    real0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    real = time.perf_counter() - real0
    text = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"replay failed in {checkout}: {text[-2000:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "real_s": real, "line": text.strip().splitlines()[-1],
            "result": json.loads(out.read_text())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, type=Path, help="checkout of the old code (with .venv)")
    p.add_argument("--after", required=True, type=Path, help="checkout of the new code (with .venv)")
    p.add_argument("--runs", nargs="+", default=list(RUNS), help="system:model pairs")
    p.add_argument("--segment", type=int, default=1)
    p.add_argument("--minutes", type=float, default=120.0)
    p.add_argument("--repeat", type=int, default=1, help="before/after pairs per run kind")
    p.add_argument("--json", type=Path, default=None, help="write the measurements here")
    p.add_argument("--parallel", type=int, default=1, help="replays at once (a pair's two start together)")
    args, extra = p.parse_known_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="replay-cpu-") as tmp, ThreadPoolExecutor(args.parallel) as pool:
        jobs = []
        for kind in args.runs:
            system, model = kind.split(":")
            for rep in range(args.repeat):
                pair = {label: pool.submit(run_replay, checkout.resolve(), system, model, segment=args.segment,
                                           minutes=args.minutes, out=Path(tmp) / f"{label}-{system}-{model}-{rep}.json",
                                           extra=extra)
                        for label, checkout in (("before", args.before), ("after", args.after))}
                jobs.append((kind, pair))
        for kind, futures in jobs:
            pair = {label: f.result() for label, f in futures.items()}
            for label, r in pair.items():
                print(f"{kind} {label}: {r['cpu_s']:.1f} CPU s, {r['real_s']:.1f} s real; {r['line']}", flush=True)
            same = all(pair["before"]["result"][k] == pair["after"]["result"][k] for k in _COMPARED)
            b, a = pair["before"]["cpu_s"], pair["after"]["cpu_s"]
            events = [(pair[x]["result"]["run"].get("loop") or {}).get("steps") for x in ("before", "after")]
            row = {"run": kind, "before_cpu_s": round(b, 1), "after_cpu_s": round(a, 1),
                   "ratio": round(a / b, 3), "identical": same, "loop_steps": events}
            rows.append(row)
            print(f"{kind}: before {b:.1f} CPU s, after {a:.1f} CPU s, after/before {a / b:.2f}, "
                  f"results {'identical' if same else 'DIFFERENT'}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
