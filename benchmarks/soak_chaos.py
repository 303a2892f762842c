"""Chaos soak: workers are killed (SIGKILL) and frozen (SIGSTOP) under mixed load.

A router process in front of three emulated worker processes serves, all at once,
``/generate`` streams, non-streaming ``/generate`` requests and OpenAI chat streams while
one worker is SIGKILLed and another SIGSTOPped. Each request ends one of three ways:
completed, an explicit error (a JSON error reply or an error event in its stream), or
lost (the connection broke or the stream ended without either). The faults strike while
many requests are in flight. Completed answers of every kind are sampled and compared
with a fresh reference worker: ``/generate`` token for token, chat streams by content.

    python benchmarks/soak_chaos.py [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from benchmarks.soak_clients import _healthy, _start  # noqa: E402
from pearl_sglang.control.processes import free_port  # noqa: E402


@dataclass
class Chaos:
    requests: int = 0
    completed: int = 0
    explicit_errors: int = 0
    lost: int = 0
    by_kind: dict | None = None
    checked_exact: int = 0
    mismatched: int = 0
    seconds: float = 0.0
    router_migrations: float = 0.0      # pearl_migrations_total: /generate items moved
    router_worker_failures: float = 0.0  # pearl_worker_failures_total, all slots


def _failed(r: httpx.Response) -> str:
    """A non-200 reply's outcome: an explicit error the client can act on, or a lost request."""
    return "error" if "error" in r.json() else "lost"


async def _sse(c: httpx.AsyncClient, url: str, body: dict) -> tuple[str | None, list[dict]]:
    """A streamed request's ``data:`` events, or its failed outcome when the reply is not 200."""
    async with c.stream("POST", url, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return _failed(r), []
        return None, [json.loads(line[5:]) async for line in r.aiter_lines()
                      if line.startswith("data:") and "[DONE]" not in line]


async def _generate(c: httpx.AsyncClient, url: str, body: dict, stream: bool) -> tuple[str, list[int] | None]:
    if not stream:
        r = await c.post(url + "/generate", json=body)
        return ("ok", r.json()["output_ids"]) if r.status_code == 200 else (_failed(r), None)
    failed, events = await _sse(c, url + "/generate", body)
    if failed or any("error" in e for e in events):
        return failed or "error", None
    last = next((e for e in reversed(events) if "output_ids" in e), None)
    done = last is not None and last["meta_info"]["finish_reason"] is not None
    return ("ok", last["output_ids"]) if done else ("lost", None)


async def _chat(c: httpx.AsyncClient, url: str, body: dict) -> tuple[str, str | None]:
    """The stream's outcome and, when it completed, its whole content."""
    failed, events = await _sse(c, url + "/v1/chat/completions", body)
    if failed or any("error" in e for e in events):
        return failed or "error", None
    choices = [choice for e in events for choice in e.get("choices") or []]
    finished = any(choice.get("finish_reason") for choice in choices)
    content = "".join(choice.get("delta", {}).get("content") or "" for choice in choices)
    return ("ok", content) if finished else ("lost", None)


def _chat_body(i: int, tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": tokens, "ignore_eos": True}


async def _one(url: str, kind: str, i: int, tokens: int, out: list) -> None:
    body = {"input_ids": [20 + i % 500, 31, 47 + i % 7], "sampling_params": {"max_new_tokens": tokens,
                                                                             "ignore_eos": True}}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10)) as c:
            if kind == "chat":
                result = await _chat(c, url, _chat_body(i, tokens))
                body = _chat_body(i, tokens)
            else:
                result = await _generate(c, url, body, stream=kind == "generate_stream")
    except (httpx.HTTPError, ValueError) as e:
        result = ("lost", repr(e))
    out.append((kind, body, *result))


async def run(*, requests: int, tokens: int, time_scale: float, seed: int = 5) -> Chaos:
    rng = random.Random(seed)
    ports = [free_port() for _ in range(3)]
    workers = [_start(["-m", "pearl_sglang.emulator", "--host", "127.0.0.1", "--port", str(p),
                       "--profile", "tiny", "--time-scale", str(time_scale)]) for p in ports]
    rport = free_port()
    router = None
    stopped = None
    chaos = Chaos()
    started = time.monotonic()
    try:
        for p in ports:
            await _healthy(f"http://127.0.0.1:{p}")
        router = _start(["-m", "pearl_sglang.router", "--port", str(rport), "--worker-urls",
                         *(f"http://127.0.0.1:{p}" for p in ports), "--stall-s", "3", "--health-interval-s", "1",
                         "--log-level", "WARNING"])
        url = f"http://127.0.0.1:{rport}"
        await _healthy(url)
        out: list = []
        kinds = ["generate_stream", "generate", "chat"]
        tasks = []
        for i in range(requests):
            tasks.append(asyncio.ensure_future(_one(url, kinds[i % 3], i, tokens, out)))
            if i in (requests // 4, requests // 2):
                # Strike while many requests run, so the faults land on requests in flight.
                for _ in range(500):
                    if len(tasks) - len(out) >= min(requests // 8, 40):
                        break
                    await asyncio.sleep(0.01)
                if i == requests // 4:
                    workers[0].send_signal(signal.SIGKILL)
                else:
                    os.kill(workers[1].pid, signal.SIGSTOP)
                    stopped = workers[1]
            await asyncio.sleep(rng.uniform(0, 0.02))
        await asyncio.gather(*tasks)
        async with httpx.AsyncClient(timeout=10) as c:
            metrics = (await c.get(url + "/metrics")).text.splitlines()
        chaos.router_migrations = sum(float(m.split()[-1]) for m in metrics if m.startswith("pearl_migrations_total"))
        chaos.router_worker_failures = sum(float(m.split()[-1]) for m in metrics
                                           if m.startswith("pearl_worker_failures_total"))
        chaos.seconds = round(time.monotonic() - started, 1)
        chaos.requests = len(out)
        chaos.completed = sum(o[2] == "ok" for o in out)
        chaos.explicit_errors = sum(o[2] == "error" for o in out)
        chaos.lost = sum(o[2] == "lost" for o in out)
        chaos.by_kind = {k: {s: sum(o[0] == k and o[2] == s for o in out) for s in ("ok", "error", "lost")}
                         for k in kinds}
        done = [o for o in out if o[2] == "ok"]
        await _check_exact(rng.sample(done, min(90, len(done))), time_scale, chaos)
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        for proc in (router, *workers):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except Exception:  # noqa: BLE001 - best effort at the end of a benchmark
                    proc.kill()
    return chaos


async def _check_exact(sample: list, time_scale: float, chaos: Chaos) -> None:
    port = free_port()
    ref = _start(["-m", "pearl_sglang.emulator", "--host", "127.0.0.1", "--port", str(port), "--profile", "tiny",
                  "--time-scale", str(max(time_scale, 200))])
    try:
        await _healthy(f"http://127.0.0.1:{port}")
        async with httpx.AsyncClient(timeout=120) as c:
            for kind, body, _, got in sample:
                if kind == "chat":
                    r = await c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
                    want = r.json()["choices"][0]["message"]["content"]
                else:
                    want = (await c.post(f"http://127.0.0.1:{port}/generate", json=body)).json()["output_ids"]
                chaos.checked_exact += 1
                chaos.mismatched += want != got
    finally:
        ref.terminate()
        ref.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 requests of 100 tokens (CI)")
    args = parser.parse_args()
    chaos = asyncio.run(run(requests=60, tokens=100, time_scale=20) if args.quick
                        else run(requests=600, tokens=300, time_scale=10))
    print(json.dumps(asdict(chaos), indent=1))
    return 1 if chaos.lost or chaos.mismatched else 0


if __name__ == "__main__":
    raise SystemExit(main())
