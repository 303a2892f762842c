"""Servers for property-based fuzzing, run in a background thread with their own event
loop: Hypothesis drives a synchronous client, so every example is a real HTTP request and
a hang shows up as a client timeout instead of a stuck test."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import replace
from typing import AsyncContextManager, Callable

import pytest

from pearl_sglang.router.state import ROUTER
from tests.control.conftest import cluster_config, running_cluster
from tests.router.conftest import running_router, with_limits
from tests.support.emulated import emulator


class ServerThread:
    """Enter an async context (servers) in a private loop; ``url`` is what it yields first."""

    def __init__(self, make: Callable[[], AsyncContextManager]) -> None:
        self._make = make
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self.value = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self._make() as value:
                self.value = value
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - surfaced to the test thread
            self.error = e
            self._ready.set()

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(60) or self.error is not None:
            raise RuntimeError(f"servers did not start: {self.error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self.error is not None:
            raise self.error  # e.g. an invariant violation seen while the servers ran

    def call(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the servers' loop (to read their state between examples)."""
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)


@contextlib.asynccontextmanager
async def _router_over_emulator():
    async with emulator("--time-scale", "200") as (worker_url, worker):
        # A worker's 5xx to one request must not open the worker's circuit for the next
        # examples (that poisoning is a known issue with its own test in tests/faults).
        config = replace(with_limits(max_new_tokens=64, max_batch_size=8, max_n=4, max_body_bytes=1 << 20),
                         failures_to_open=1 << 30)
        async with running_router(regular=[worker_url], config=config) as (url, app, _):
            yield url, app, worker_url


@pytest.fixture(scope="module")
def fuzz_router():
    """(router url, app, worker url): a router in attach mode over one emulated worker."""
    with ServerThread(_router_over_emulator) as server:
        yield server


@pytest.fixture(scope="module")
def fuzz_cluster(tiny_model_dir):
    """A router with the control plane over an in-process emulated cluster."""
    @contextlib.asynccontextmanager
    async def make():
        config = cluster_config(tiny_model_dir, dedicated=2, overlap=2, time_scale=200)
        async with running_cluster(config) as c:
            yield c
    with ServerThread(make) as server:
        yield server


def inflight(server: ServerThread) -> int:
    return server.call(lambda: len(server.value[1][ROUTER].inflight))
