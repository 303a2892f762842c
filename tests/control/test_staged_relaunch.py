"""Colocated <-> PD changes relaunch workers in waves: the cluster serves throughout.

Launches are held at a gate the test opens, so "during" is a state the test can look at:
while the first wave relaunches, the old topology serves; while the last one does, the
first new workers serve. A failed start in a later wave leaves the cluster serving and
the operator gets the truth (503 target_not_reached)."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace

import pytest

from pearl_sglang.control.launchers import LaunchedWorker, LaunchError, LaunchSpec
from pearl_sglang.core.state import Activity, Role
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.dispatch import DispatchConfig
from tests.control.conftest import cluster_config, running_cluster
from tests.faults.support import until

pytestmark = pytest.mark.timeout(120)

IDS = [8, 6, 7, 5, 3, 0, 9]


@dataclass
class GatedLauncher(InProcessEmulatorLauncher):
    """Emulated workers whose starts wait at a gate while ``gated`` (the bootstrap runs
    through); ``refuse(spec)`` makes a start fail instead."""

    gated: bool = False
    waiting: list = field(default_factory=list)
    refuse: object = lambda spec: False

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        if self.gated:
            gate = asyncio.get_running_loop().create_future()
            self.waiting.append((spec, gate))
            await gate
        if self.refuse(spec):
            raise LaunchError(f"injected: slot {spec.slot} exited during start")
        return await super().launch(spec)

    def open(self) -> list[LaunchSpec]:
        """Let every start waiting now go on; returns their specs."""
        waiting, self.waiting = self.waiting, []
        for _, gate in waiting:
            gate.set_result(None)
        return [spec for spec, _ in waiting]


def backoff(config, *delays):
    """Re-plans after these delays: long enough that a test looks at the cluster the
    failure left before the re-plan changes it."""
    return replace(config, recovery=replace(config.recovery, growth_backoff_s=delays))


@contextlib.asynccontextmanager
async def gated_cluster(config, **kw):
    """A running cluster over a ``GatedLauncher``; the gate opens for good on the way out
    (a failed assertion must not leave starts waiting for ever)."""
    async with running_cluster(config, launcher_factory=lambda cluster, session: GatedLauncher(cluster.engine),
                               **kw) as c:
        try:
            yield c
        finally:
            c.launcher.gated = False
            c.launcher.open()


def relaunching(table) -> list[int]:
    return [w.slot for w in table.rollout_workers() if w.activity is Activity.SWITCHING and not w.held]


async def wave_waiting(c) -> list[int]:
    """Wait until every worker of the wave in flight waits at the gate; its slots."""
    await until(lambda: relaunching(c.table) and len(c.launcher.waiting) == len(relaunching(c.table)),
                timeout=30, what="the wave's starts to reach the gate")
    return sorted(spec.slot for spec, _ in c.launcher.waiting)


def watch_serving(c) -> list:
    """Every active topology the table goes through from now on."""
    seen = []
    c.store.on_change(lambda old, new: seen.append(new.active_topology()))
    return seen


def servable(topo) -> bool:
    return topo.total > 0 and (topo.prefill >= 1) == (topo.decode >= 1)


async def test_colocated_to_pd_serves_requests_during_every_wave(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=4, overlap=0)
    async with gated_cluster(config) as c:
        assert c.table.active_topology().colocated == 4
        expected = (await c.generate(IDS, 30))["output_ids"]
        seen = watch_serving(c)
        c.launcher.gated = True
        long_run = asyncio.ensure_future(c.generate(IDS, 400))  # in flight when the change begins
        change = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "disaggregated"}))
        first = await wave_waiting(c)
        assert 0 < len(first) < 4 and c.table.active_topology().colocated == 4 - len(first)
        # Sent after the first wave began: served by the colocated workers still up.
        assert (await c.generate(IDS, 30))["output_ids"] == expected
        c.launcher.open()
        last = await wave_waiting(c)
        assert not set(first) & set(last)
        during_last = c.table.active_topology()
        assert during_last.prefill >= 1 and during_last.decode >= 1 and during_last.colocated == 0
        # Sent after the first wave is admitted, before the last is healthy: the new PD pair serves it.
        assert (await c.generate(IDS, 30))["output_ids"] == expected
        assert not change.done()
        c.launcher.open()
        out = await change
        topo = c.table.active_topology()
        assert topo.colocated == 0 and topo.prefill + topo.decode == 4, out
        assert [w["keeps_serving"] for w in out["waves"]] == [True, True], out
        assert (await long_run)["meta_info"]["completion_tokens"] == 400
    assert seen and all(servable(t) for t in seen), seen


async def test_pd_to_colocated_serves_requests_during_every_wave(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=4, overlap=0, pd_mode="2:2")
    async with gated_cluster(config) as c:
        assert (c.table.active_topology().prefill, c.table.active_topology().decode) == (2, 2)
        seen = watch_serving(c)
        c.launcher.gated = True
        long_run = asyncio.ensure_future(c.generate(IDS, 400))
        change = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "colocated"}))
        first = await wave_waiting(c)
        assert c.table.active_topology().label() == "1P1D", first
        assert (await c.generate(IDS, 30))["meta_info"]["completion_tokens"] == 30
        c.launcher.open()
        await wave_waiting(c)
        assert c.table.active_topology().label() == "2C"
        assert (await c.generate(IDS, 30))["meta_info"]["completion_tokens"] == 30
        c.launcher.open()
        out = await change
        assert c.table.active_topology().colocated == 4 and len(out["waves"]) == 2, out
        assert (await long_run)["meta_info"]["completion_tokens"] == 400
    assert seen and all(servable(t) for t in seen), seen


async def test_when_no_old_path_can_be_kept_one_worker_relaunches_first_and_the_answer_says_so(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=0, pd_mode="disaggregated")
    async with gated_cluster(config) as c:
        assert c.table.active_topology().label() == "1P1D"
        c.launcher.gated = True
        change = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "colocated"}))
        assert len(await wave_waiting(c)) == 1
        c.launcher.open()
        await wave_waiting(c)
        assert c.table.active_topology().label() == "1C"  # the first new worker serves meanwhile
        assert (await c.generate(IDS, 20))["meta_info"]["completion_tokens"] == 20
        c.launcher.open()
        out = await change
        assert c.table.active_topology().colocated == 2
        assert [w["keeps_serving"] for w in out["waves"]] == [False, True], out
        assert any("wave" in d and not d["wave"]["keeps_serving"] for d in c.control.decisions)
        c.launcher.gated = False
        out = await c.admin("/pearl/pd_mode", {"pd_mode": "disaggregated"})  # a pair needs both: one wave
        assert c.table.active_topology().label() == "1P1D"
        assert [w["keeps_serving"] for w in out["waves"]] == [False], out


async def test_a_request_waits_for_the_workers_a_change_relaunches_longer_than_the_route_wait(tiny_model_dir):
    """A change that keeps no old path serving leaves a gap of PEARL's own making: a request
    arriving in it waits for the relaunched workers, not ``route_wait_s`` and a 503 (an
    elastic replay lost every first turn of a step to a 60 s route wait this way)."""
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=0, pd_mode="disaggregated")
    impatient = RouterConfig(health_interval_s=3600, dispatch=DispatchConfig(route_wait_s=0.5, arriving_wait_s=60))
    async with gated_cluster(config, router_config=impatient) as c:
        c.launcher.gated = True
        change = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "colocated"}))
        await wave_waiting(c)
        assert c.table.active_topology().label() == "0P0D"  # nothing serves
        request = asyncio.ensure_future(c.generate(IDS, 20))
        await asyncio.sleep(1.5)  # three route waits
        assert not request.done()
        c.launcher.gated = False
        c.launcher.open()
        assert (await request)["meta_info"]["completion_tokens"] == 20
        await change


async def test_a_failed_start_in_the_last_wave_leaves_the_cluster_serving_and_answers_503(tiny_model_dir):
    config = backoff(cluster_config(tiny_model_dir, dedicated=4, overlap=0), 2.0)
    async with gated_cluster(config) as c:
        seen = watch_serving(c)
        c.launcher.gated = True
        change = asyncio.ensure_future(c.client.post(c.url + "/pearl/pd_mode", json={"pd_mode": "disaggregated"},
                                                     headers=c.auth))
        await wave_waiting(c)
        c.launcher.open()
        last = await wave_waiting(c)
        refused = set(last)
        c.launcher.refuse = lambda spec: spec.slot in refused and spec.role is not Role.COLOCATED
        c.launcher.gated = False
        c.launcher.open()
        r = await change
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "target_not_reached" and "injected" in r.text
        # The first wave's pair serves beside the restored colocated workers.
        topo = c.table.active_topology()
        assert topo.prefill >= 1 and topo.decode >= 1 and topo.colocated == len(refused), topo
        assert (await c.generate(IDS, 20))["meta_info"]["completion_tokens"] == 20
        c.launcher.refuse = lambda spec: False
        await until(lambda: c.table.active_topology().colocated == 0
                    and c.table.active_topology().total == 4, timeout=30,
                    what="the re-plan after the back-off to reach the PD target")
    assert seen and all(servable(t) for t in seen), seen


async def test_a_pair_whose_switch_to_colocated_failed_serves_again(tiny_model_dir):
    """Before: abandoning a 1P1D -> 2C switch held both workers (each came back while the
    other was still switching), so nothing served."""
    config = backoff(cluster_config(tiny_model_dir, dedicated=2, overlap=0, pd_mode="disaggregated"), 30.0)
    async with gated_cluster(config) as c:
        c.launcher.refuse = lambda spec: spec.role is Role.COLOCATED
        r = await c.client.post(c.url + "/pearl/pd_mode", json={"pd_mode": "colocated"}, headers=c.auth)
        assert r.status_code == 503, r.text
        assert c.table.active_topology().label() == "1P1D", c.table.to_dict()
        assert (await c.generate(IDS, 20))["meta_info"]["completion_tokens"] == 20
