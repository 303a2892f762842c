"""Client-side soak: slow peers and never-reading streams against a router process.

A router subprocess with a low descriptor limit (RLIMIT_NOFILE, soft and hard) sits in
front of an emulated worker subprocess. Two phases, each printed as numbers:

* slow connections: ``--slow`` connections from 127.0.0.2 that trickle a request line
  and never finish their headers, more than the router's descriptor limit, while normal
  ``/generate`` requests from 127.0.0.1 keep flowing. Counts: slow connections refused
  (503) or closed by the header timeout, normal requests completed and failed.
* never-reading streams: two clients ask for a long ``/generate`` stream and never read;
  the router's resident memory growth (VmRSS) is measured once the worker has finished.

    python benchmarks/soak_clients.py [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from pearl_sglang.control.processes import free_port  # noqa: E402


@dataclass
class ClientSoak:
    nofile: int
    slow_connections: int
    slow_refused_503: int = 0
    slow_closed_by_router: int = 0
    slow_still_open: int = 0
    normal_requests: int = 0
    normal_completed: int = 0
    normal_failed: int = 0
    normal_p50_s: float = 0.0
    stream_tokens: int = 0
    never_reading_clients: int = 2
    router_rss_before_mb: float = 0.0
    router_rss_after_mb: float = 0.0
    router_rss_growth_mb: float = 0.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _limit_fds(nofile: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    return apply


def _start(argv: list[str], nofile: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_limit_fds(nofile) if nofile else None)


async def _healthy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy")


async def _slow_peer(port: int, out: dict[str, int], hold_s: float) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
    except OSError:
        out["connect_failed"] = out.get("connect_failed", 0) + 1
        return
    try:
        deadline = time.monotonic() + hold_s
        for byte in b"POST /generate HTTP/1.1\r\nHost: x\r\n":
            writer.write(bytes([byte]))
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.5)
            except asyncio.TimeoutError:
                if time.monotonic() > deadline:
                    out["still_open"] = out.get("still_open", 0) + 1
                    return
                continue
            kind = "refused" if data.startswith(b"HTTP/1.1 503") else "closed"
            out[kind] = out.get(kind, 0) + 1
            return
        out["still_open"] = out.get("still_open", 0) + 1
    except (ConnectionError, OSError):
        out["closed"] = out.get("closed", 0) + 1
    finally:
        writer.close()


async def _normal(url: str, n: int, soak: ClientSoak) -> None:
    times: list[float] = []
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with sem:
            started = time.monotonic()
            try:
                async with httpx.AsyncClient(timeout=60) as c:
                    r = await c.post(url + "/generate", json={
                        "input_ids": [7, 8, 9 + i], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
                ok = r.status_code == 200 and len(r.json()["output_ids"]) == 8
            except httpx.HTTPError:
                ok = False
            soak.normal_completed += ok
            soak.normal_failed += not ok
            times.append(time.monotonic() - started)

    await asyncio.gather(*(one(i) for i in range(n)))
    soak.normal_requests = n
    soak.normal_p50_s = round(sorted(times)[len(times) // 2], 3)


async def _never_reading(url: str, port: int, tokens: int, router: subprocess.Popen, soak: ClientSoak) -> None:
    sampling = {"max_new_tokens": tokens, "ignore_eos": True, "stream_interval": 1}
    body = json.dumps({"input_ids": list(range(100, 400)), "stream": True, "sampling_params": sampling}).encode()
    soak.router_rss_before_mb = round(_rss_mb(router.pid), 1)
    writers = []
    for _ in range(soak.never_reading_clients):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.set_write_buffer_limits(0)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        writers.append(writer)
    async with httpx.AsyncClient(timeout=10) as c:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            metrics = (await c.get(url + "/metrics")).text
            inflight = next(float(line.split()[-1]) for line in metrics.splitlines()
                            if line.startswith("pearl_inflight_requests "))
            if inflight == 0:
                break
    soak.router_rss_after_mb = round(_rss_mb(router.pid), 1)
    soak.router_rss_growth_mb = round(soak.router_rss_after_mb - soak.router_rss_before_mb, 1)
    for writer in writers:
        writer.close()


async def run(*, nofile: int, slow: int, normal: int, tokens: int, time_scale: float) -> ClientSoak:
    soak = ClientSoak(nofile=nofile, slow_connections=slow, stream_tokens=tokens)
    wport, rport = free_port(), free_port()
    worker = _start(["-m", "pearl_sglang.emulator", "--host", "127.0.0.1", "--port", str(wport),
                     "--profile", "tiny", "--time-scale", str(time_scale)])
    router = None
    try:
        await _healthy(f"http://127.0.0.1:{wport}")
        router = _start(["-m", "pearl_sglang.router", "--port", str(rport), "--worker-urls",
                         f"http://127.0.0.1:{wport}", "--max-connections-per-client", str(nofile // 4),
                         "--header-timeout-s", "20", "--log-level", "WARNING"], nofile=nofile)
        url = f"http://127.0.0.1:{rport}"
        await _healthy(url)
        outcome: dict[str, int] = {}
        peers = [asyncio.ensure_future(_slow_peer(rport, outcome, hold_s=15)) for _ in range(slow)]
        await asyncio.sleep(2.0)  # the slow peers hold their connections first
        await _normal(url, normal, soak)
        await asyncio.gather(*peers)
        soak.slow_refused_503 = outcome.get("refused", 0)
        soak.slow_closed_by_router = outcome.get("closed", 0) + outcome.get("connect_failed", 0)
        soak.slow_still_open = outcome.get("still_open", 0)
        await _never_reading(url, rport, tokens, router, soak)
    finally:
        for proc in (router, worker):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="300 slow connections under 256 descriptors, 2,000-token streams (CI)")
    args = parser.parse_args()
    if args.quick:
        soak = asyncio.run(run(nofile=256, slow=300, normal=40, tokens=2000, time_scale=50))
    else:
        soak = asyncio.run(run(nofile=1024, slow=1100, normal=400, tokens=6000, time_scale=20))
    print(json.dumps(asdict(soak), indent=1))
    ok = soak.normal_failed == 0 and soak.router_rss_growth_mb < 50
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
