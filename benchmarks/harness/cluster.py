"""An elastic cluster in one event loop: PEARL's router and control plane over emulated
workers served by the in-process launcher (real HTTP on loopback). Used by scenario
tests and benchmarks that need many reconfigurations quickly."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import httpx
from aiohttp import web

from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.state_store import StateStore
from pearl_sglang.core.state import Activity, StateTable, check
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from pearl_sglang.server.compose import build_app
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.state import ROUTER

# Decision-engine inputs for clusters of the emulator's "tiny" profile (tests, soak): small
# enough that every PD split of a few workers is feasible once N_D >= 2.
TINY_PROFILE = dict(B=16, S=5, delta_L=200, r=50, theta=0.5, A=0.002, b=5e-5, t_prefill=2e-5, K=65536,
                    BW=5e9, T_over=0.01, T_env=1.0, K_seq=1e8, H_max=1e9)


class Cluster:
    def __init__(self, url, app, store, launcher, token):
        self.url, self.app, self.store, self.launcher = url, app, store, launcher
        self.auth = {"Authorization": f"Bearer {token}"}
        self.client = httpx.AsyncClient(timeout=60)

    @property
    def control(self):
        return self.app[ROUTER].control

    @property
    def table(self) -> StateTable:
        return self.store.table

    async def admin(self, path, body, expect=200, timeout: float | None = None):
        """POST an admin call; ``timeout`` overrides the client's 60 s for calls that wait on
        engine launches (a real SGLang relaunch on a loaded CPU machine can take minutes)."""
        extra = {} if timeout is None else {"timeout": timeout}
        r = await self.client.post(self.url + path, json=body, headers=self.auth, **extra)
        assert r.status_code == expect, r.text
        return r.json()

    async def generate(self, ids, n=16):
        r = await self.client.post(self.url + "/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}})
        assert r.status_code == 200, r.text
        return r.json()

    async def settle(self, timeout=30.0):
        """Wait until no worker is transitioning and background growth is done."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            growth = self.control.growths.current
            moving = [w for w in self.table.rollout_workers()
                      if w.activity in (Activity.JOINING, Activity.LEAVING)
                      or (w.activity is Activity.SWITCHING and not w.held)]
            if (growth is None or growth.task.done()) and not moving:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"cluster did not settle: {self.table.to_dict()}")


@contextlib.asynccontextmanager
async def running_cluster(config: ClusterConfig, *, launcher_cls=InProcessEmulatorLauncher, launcher_factory=None,
                          settle_s: float = 30.0, token: str = "pearl-test-token",
                          router_config: RouterConfig | None = None):
    """Router + control plane + workers in this event loop, on a free loopback port;
    the table's invariants are checked on every change and asserted at the end.
    ``router_config``: the router's settings (its admin token is ``token``)."""
    store = StateStore(StateTable.create(tp_size=config.engine.tp_size, dedicated_gpus=config.zones.dedicated,
                                         overlap_gpus=config.zones.overlap))
    violations = []
    store.on_change(lambda old, new: violations.extend(_check(new)))
    launchers = []

    def factory(cluster, session):
        launchers.append(launcher_factory(cluster, session) if launcher_factory else launcher_cls(cluster.engine))
        return launchers[-1]

    router_config = replace(router_config or RouterConfig(health_interval_s=3600),
                            security=Security(admin_token=token))
    app = build_app(router_config, store, config, launcher_factory=factory)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
    cluster = Cluster(f"http://127.0.0.1:{port}", app, store, launchers[0], token)
    try:
        await cluster.settle(settle_s)
        yield cluster
    finally:
        await cluster.client.aclose()
        await runner.cleanup()
    assert not violations, violations


def _check(table):
    try:
        check(table)
        return []
    except Exception as e:  # noqa: BLE001 - collected and asserted at the end
        return [repr(e)]
