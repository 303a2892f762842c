"""What a turn's parsing costs the router right after it was idle (not a timed test).

    .venv/bin/python -m benchmarks.wake_cost [--quick] [--sizes tiny 4k 32k] [--calls 300]
        [--out benchmarks/results/wake_cost.json]

At one client the router waits between turns (for the worker, and for the client's next
turn), so every turn starts after the process was idle. This measures, in one process
and nothing else of PEARL's running, the CPU time (``time.thread_time_ns``) of the work
the router does on each turn before it routes it (``parse_head``, ``generate_json``,
``parse_generate``, ``prefix_key``: the ``/generate`` lane's own calls) when the call comes
after an idle gap of 0 (back to back), 0.5, 2 and 5 ms, and after sweeping 8 MB of other
memory (what the workers and the client touch between two turns of one client). Beside it,
the same for a relay's work on the turn (one copy of its body): what a byte relay pays
for the same gaps.

The ratio against back to back is the price of idleness on this host: the same calls, in
the same process, with warm or cooled caches. ``benchmarks/README.md`` ("Router overhead",
"Sixth round") reads the one-client latencies of ``router_overhead.py --agentic`` with it.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness.cli_args import positive_int  # noqa: E402
from benchmarks.router_agentic import request_body  # noqa: E402
from pearl_sglang.router.config import Limits  # noqa: E402
from pearl_sglang.router.generate_request import parse_generate  # noqa: E402
from pearl_sglang.router.http1 import parse_head  # noqa: E402
from pearl_sglang.router.middleware import generate_json  # noqa: E402
from pearl_sglang.router.selection import context_tokens, prefix_key  # noqa: E402

SIZES = {"tiny": 24, "4k": 4096, "32k": 32768}
GAPS_MS = (0.0, 0.5, 2.0, 5.0)
SWEEP_BYTES = 8 << 20
_HEAD = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:30000\r\nUser-Agent: Python/3.11 aiohttp/3.9.5\r\n"
         b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d")


def turn(size: int, seed: int = 0) -> tuple[bytes, bytes]:
    """A rollout turn as the router benchmarks send it: its head and its body."""
    rng = random.Random(seed)
    body = request_body([rng.randrange(3, 1000) for _ in range(size)], stream=False, max_new=16)
    return _HEAD % len(body), body


def router_parse(head: bytes, body: bytes, limits: Limits) -> int:
    """The lane's work on a turn before it is routed; returns its context in tokens."""
    if parse_head(head) is None:
        raise ValueError("the head did not parse")
    decoded, checked = generate_json(body, limits.max_json_depth)
    call = parse_generate(decoded, limits, checked)
    item, = call.items
    prefix_key(item.input_ids, item.text)
    return context_tokens(item.input_ids, item.text)


def relay_copy(head: bytes, body: bytes) -> int:
    with memoryview(body) as view:
        return len(head) + len(bytes(view))


def pauses(sweep: np.ndarray) -> dict[str, Callable[[], object]]:
    """What comes before each measured call, by its label: an idle gap, or a memory sweep."""
    out: dict[str, Callable[[], object]] = {
        f"{gap:g} ms": (lambda s=gap / 1e3: time.sleep(s)) if gap else (lambda: None) for gap in GAPS_MS}
    out["sweep"] = sweep.sum
    return out


def cpu_us(call: Callable[[], object], before: Callable[[], object], calls: int) -> float:
    """Median CPU microseconds of ``call``, each call made right after ``before()``."""
    out = []
    for _ in range(calls):
        before()
        t = time.thread_time_ns()
        call()
        out.append(time.thread_time_ns() - t)
    return statistics.median(out) / 1e3


def measure(sizes: list[str], calls: int) -> list[dict]:
    limits = Limits()
    before_each = pauses(np.ones(SWEEP_BYTES, dtype=np.uint8))
    rows = []
    for name in sizes:
        head, body = turn(SIZES[name])
        if router_parse(head, body, limits) != SIZES[name]:
            raise RuntimeError(f"{name}: the router parsed another context length")
        work = {"router parse": lambda: router_parse(head, body, limits), "relay copy": lambda: relay_copy(head, body)}
        for what, call in work.items():
            for _ in range(20):  # compiled kernels loaded, allocator settled
                call()
            rows.append({"size": name, "work": what,
                         "cpu_us": {label: cpu_us(call, before, calls) for label, before in before_each.items()}})
    return rows


def markdown(rows: list[dict], calls: int) -> str:
    labels = list(rows[0]["cpu_us"])
    out = [f"# CPU of one turn's parsing after the process was idle\n",
           f"Median of {calls} calls per cell, CPU microseconds (`thread_time_ns`); in brackets the "
           f"ratio to back to back (gap 0). sweep: {SWEEP_BYTES >> 20} MB of other memory read between "
           f"calls instead of sleeping.\n",
           "| size | work | " + " | ".join(f"after {x}" for x in labels) + " |",
           "|---|---|" + "---|" * len(labels)]
    for r in rows:
        base = r["cpu_us"][labels[0]]
        cells = [f"{v:.1f}" + ("" if k == labels[0] else f" ({v / base:.1f}x)") for k, v in r["cpu_us"].items()]
        out.append(f"| {r['size']} | {r['work']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 calls per cell (~10 s)")
    ap.add_argument("--calls", type=positive_int, default=None, help="calls per cell (default 300, quick 60)")
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "wake_cost.json")
    args = ap.parse_args(argv)
    calls = args.calls or (60 if args.quick else 300)
    rows = measure(args.sizes, calls)
    text = markdown(rows, calls)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"calls": calls, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
