"""Workers that cannot start: the control plane says so and climbs back by itself.

A growth that stops short of its target (a launch failed) is re-planned after a back-off
without waiting for another admin call, and an operator change whose topology cannot be
reached answers an error instead of a success with whatever is left."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from pearl_sglang.control.launchers import LaunchedWorker, LaunchError, LaunchSpec
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from pearl_sglang.core.state import Role
from tests.control.conftest import cluster_config, running_cluster
from tests.faults.support import until


@dataclass
class FailingLauncher(InProcessEmulatorLauncher):
    """Emulated workers whose start fails while ``refuse(spec)`` says so."""

    refuse: object = lambda spec: False
    refused: list = field(default_factory=list)

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        if self.refuse(spec):
            self.refused.append(spec)
            raise LaunchError(f"injected: slot {spec.slot} exited during start (address already in use)")
        return await super().launch(spec)


def failing(refuse):
    return lambda cluster, session: FailingLauncher(cluster.engine, refuse=refuse)


def fast_backoff(config):
    return replace(config, recovery=replace(config.recovery, growth_backoff_s=(0.2, 0.5)))


async def test_a_growth_stopped_by_a_failed_start_is_replanned_without_another_call(tiny_model_dir):
    failures = iter([True, True])  # the first two starts on d0:1 fail

    def refuse(spec):
        return "d0:1" in spec.gpus and next(failures, False)

    config = fast_backoff(cluster_config(tiny_model_dir, dedicated=2, overlap=0))
    async with running_cluster(config, launcher_factory=failing(refuse), settle_s=60) as c:
        await until(lambda: c.table.active_topology().total == 2, timeout=20,
                    what="the failed worker to be re-planned and started")
        assert len(c.launcher.refused) == 2
        assert {g for w in c.table.active() for g in w.gpus} == {"d0:0", "d0:1"}
        assert any(d["operation"].endswith("_replan") for d in c.control.decisions)


async def test_pd_mode_whose_topology_cannot_start_answers_an_error(tiny_model_dir):
    config = fast_backoff(cluster_config(tiny_model_dir, dedicated=3, overlap=0))
    async with running_cluster(config, launcher_factory=failing(lambda s: s.role is not Role.COLOCATED)) as c:
        assert c.table.active_topology().total == 3
        r = await c.client.post(c.url + "/pearl/pd_mode", json={"pd_mode": "disaggregated"}, headers=c.auth)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["type"] == "target_not_reached" and "injected" in err["message"], err
        await c.admin("/pearl/pd_mode", {"pd_mode": "colocated"})
        await until(lambda: c.table.active_topology().colocated == 3, timeout=20,
                    what="the colocated topology to come back")
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["completion_tokens"] == 4
