"""The routers the placement benchmark compares, each its own process in front of the
same emulated workers: PEARL's (``python -m pearl_sglang.router --worker-urls ...``, as a
user starts it, one per ``--routing-policy``) and sglang-router 0.3.2 (the Rust router).

Both run out of the benchmark's process, which holds the emulated workers and the
clients: a router in that process would add its CPU time to the workers' and clients'
event loop, a cost the other router would not pay. Both take late workers the same way,
``POST /workers`` (sglang-router's API, which PEARL serves too), and count as having
admitted them once ``/readiness`` reports them healthy.
"""
from __future__ import annotations

import abc
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.harness.servers import SglangCpuStack
from pearl_sglang.control.processes import free_port

REPO = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "placement-bench"


class RouterTarget(abc.ABC):
    """A router process over the first ``active`` of ``urls``; ``admit_rest`` adds the others."""

    kind = ""

    def __init__(self, policy: str, urls: list[str], active: int) -> None:
        self.name = f"{self.kind} {policy}"
        self.policy, self.urls, self.active = policy, urls, active
        self.headers: dict[str, str] = {}

    @abc.abstractmethod
    def argv(self, port: int) -> tuple[list[str], dict[str, str]]:
        """The router's command line and environment, listening on ``port``."""

    async def __aenter__(self) -> "RouterTarget":
        for attempt in range(3):  # a free port can be taken before the router binds it
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self.log = tempfile.NamedTemporaryFile(prefix=f"{self.kind}-", suffix=".log", delete=False)
            argv, env = self.argv(port)
            self.proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=self.log, stderr=self.log)
            try:
                await self._wait_workers(self.active)
                return self
            except RuntimeError:
                if self.proc.returncode is None:
                    self.proc.terminate()
                await self.proc.wait()
                if attempt == 2:
                    raise
        return self

    async def _wait_workers(self, n: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited; log: {self.log.name}")
                try:
                    async with s.get(self.url + "/readiness") as r:
                        if (await r.json(content_type=None)).get("healthy_workers") == n:
                            return
                except (aiohttp.ClientError, ValueError):
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} did not register {n} workers in {timeout_s:.0f}s; log: {self.log.name}")

    async def admit_rest(self, session: aiohttp.ClientSession) -> None:
        """``POST /workers`` (queued: 202), then wait until the router reports them healthy."""
        for url in self.urls[self.active:]:
            async with session.post(self.url + "/workers", json={"url": url}, headers=self.headers) as r:
                if r.status not in (200, 202):
                    raise RuntimeError(f"{self.name} refused worker {url}: HTTP {r.status} {await r.text()}")
        await self._wait_workers(len(self.urls))

    async def migrations(self, session: aiohttp.ClientSession) -> int | None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
        await self.proc.wait()


class PearlTarget(RouterTarget):
    kind = "pearl"

    def argv(self, port: int) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "pearl_sglang.router", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "WARNING", "--routing-policy", self.policy, "--health-interval-s", "3600",
                "--worker-urls", *self.urls[:self.active]]
        self.headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        env = {**os.environ, "PEARL_ADMIN_TOKEN": ADMIN_TOKEN,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        return argv, env

    async def migrations(self, session: aiohttp.ClientSession) -> int | None:
        """Requests moved mid-generation (none should be, for placement)."""
        async with session.get(self.url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith("pearl_migrations_total "):
                    return int(float(line.split()[1]))
        return None


class SglangTarget(RouterTarget):
    kind = "sglang-router"

    def __init__(self, policy: str, urls: list[str], active: int, stack: SglangCpuStack) -> None:
        super().__init__(policy, urls, active)
        self.stack = stack

    def argv(self, port: int) -> tuple[list[str], dict[str, str]]:
        return ([self.stack.python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                 "--policy", self.policy, "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                 "--log-level", "warn", "--worker-urls", *self.urls[:self.active]], {**self.stack.env})
