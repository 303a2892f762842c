"""A PD group whose KV-transfer probe fails is never admitted: the group is cancelled, the
control plane re-plans after its back-off and relaunches the worker, which pairs and is
admitted, while every accepted request completes with the right tokens.

The failure is a real one: every PD worker's bootstrap port sits behind a ``FaultProxy``;
the decodes' proxies reset every connection (a decode never uses its own bootstrap port
while decoding), so the decode that is switched in place to prefill after the only
prefill leaves cannot be reached by its partner."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import pytest

from pearl_sglang.control.launchers import LaunchedWorker, LaunchSpec
from pearl_sglang.core.state import Activity, Role
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from tests.support.fault_proxy import Fault, FaultProxy
from tests.control.conftest import cluster_config, running_cluster
from tests.control.test_elastic import reference


@dataclass
class BootstrapProxyLauncher(InProcessEmulatorLauncher):
    """Each PD worker's bootstrap port behind a proxy; stopping a worker whose proxy was
    broken ends the fault (the other proxies pass again)."""

    proxies: dict[int, FaultProxy] = field(default_factory=dict)

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        launched = await super().launch(spec)
        if launched.bootstrap_port is None:
            return launched
        proxy = await FaultProxy(target_port=launched.bootstrap_port).__aenter__()
        self.proxies[spec.slot] = proxy
        return replace(launched, bootstrap_port=int(proxy.url.rpartition(":")[2]))

    def break_bootstrap(self, slots) -> set[int]:
        for slot in slots:
            self.proxies[slot].set(Fault.RESET)
        return {int(self.proxies[s].url.rpartition(":")[2]) for s in slots}

    async def stop(self, slot: int) -> None:
        proxy = self.proxies.pop(slot, None)
        if proxy is not None:
            if proxy.fault is Fault.RESET:
                for other in self.proxies.values():
                    other.set(Fault.PASS)
            await proxy.__aexit__(None, None, None)
        await super().stop(slot)


@pytest.mark.timeout(90)
async def test_failed_pd_probe_cancels_the_group_and_a_relaunch_pairs_it(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0, pd_mode="disaggregated",
                            recovery={"pd_probe_backoff_s": [0.2, 0.5]})
    async with running_cluster(config, launcher_cls=BootstrapProxyLauncher) as c:
        assert c.table.active_topology().prefill == 1
        broken = c.launcher.break_bootstrap([w.slot for w in c.table.active(Role.DECODE)])
        admitted_broken = []
        c.store.on_change(lambda old, new: admitted_broken.extend(
            w.slot for w in new.active(Role.PREFILL) if w.bootstrap_port in broken))
        ids = [2, 7, 1, 8, 2, 8]
        expected = await reference(tiny_model_dir, ids, 40)
        launches = c.launcher.launches
        flood = [asyncio.ensure_future(c.generate(ids, 40)) for _ in range(6)]
        await asyncio.sleep(0.05)
        prefill = c.table.active(Role.PREFILL)[0]
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": list(prefill.gpus), "deadline_s": 20})
        late = [asyncio.ensure_future(c.generate(ids, 40)) for _ in range(4)]  # wait for a prefill
        await c.settle(60)
        await asyncio.sleep(0.3)  # past the first back-off: the re-plan has begun
        await c.settle(60)
        topo = c.table.active_topology()
        assert topo.prefill == 1 and topo.decode == 1, topo
        assert not admitted_broken  # the switched worker that could not transfer never served
        assert c.launcher.launches == launches + 1  # the recovery relaunched it
        new_prefill = c.table.active(Role.PREFILL)[0]
        assert new_prefill.bootstrap_port not in broken and new_prefill.gpus != prefill.gpus
        assert any(d["operation"].endswith("_pd_retry") for d in c.control.decisions)
        outs = await asyncio.gather(*flood, *late)
        assert [o["output_ids"] for o in outs] == [expected] * 10
        assert (await c.generate(ids, 40))["output_ids"] == expected
        assert all(w.activity is Activity.ACTIVE for w in c.table.rollout_workers())
