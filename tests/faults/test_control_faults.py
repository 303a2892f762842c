"""Control-plane faults on emulated clusters run by the real control plane: a weight push
that fails on one worker, a join whose worker dies while it syncs to the latest weights,
and a GPU reclaim whose worker refuses to drain. Every worker sits behind a
``FaultProxy``, so stopping one is a crash (its connections reset at once), not a
graceful drain that waits for its requests to finish."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Callable

import httpx
import pytest

from pearl_sglang.control.launchers import LaunchedWorker, LaunchSpec
from pearl_sglang.core.state import Activity
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from pearl_sglang.emulator.request import OpResult
from pearl_sglang.router.state import ROUTER
from tests.support.fault_proxy import Fault, FaultProxy
from tests.control.conftest import cluster_config, running_cluster
from tests.faults.support import until
from tests.support.emulated import emulator

Misbehave = Callable[[LaunchSpec, object, FaultProxy], None]


@dataclass
class FaultyLauncher(InProcessEmulatorLauncher):
    """Launches emulated workers behind fault proxies; ``misbehave`` may break a worker
    (by its GPUs) right after it starts."""

    misbehave: Misbehave = lambda spec, worker, proxy: None
    proxies: dict[int, FaultProxy] = field(default_factory=dict)

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        launched = await super().launch(spec)
        proxy = await FaultProxy.to(launched.endpoint).__aenter__()
        self.proxies[spec.slot] = proxy
        self.misbehave(spec, self.worker(spec.slot), proxy)
        return replace(launched, endpoint=proxy.url)

    async def stop(self, slot: int) -> None:
        proxy = self.proxies.pop(slot, None)
        if proxy is not None:
            proxy.set(Fault.RESET)
            await proxy.__aexit__(None, None, None)
        await super().stop(slot)


def faulty(misbehave: Misbehave):
    return lambda cluster, session: FaultyLauncher(cluster.engine, misbehave=misbehave)


async def reference(model_dir, ids, n):
    async with emulator("--model-path", str(model_dir), "--profile", "tiny", "--time-scale", "50") as (url, _):
        async with httpx.AsyncClient(timeout=60) as c:
            r = await c.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
                "max_new_tokens": n, "ignore_eos": True}})
            return r.json()["output_ids"]


# -- a weight push that fails on one worker ---------------------------------------------------
def fail_first_weight_push_on(gpu: str) -> Misbehave:
    failed: set[str] = set()

    def misbehave(spec, worker, proxy):
        if gpu in spec.gpus and gpu not in failed:
            failed.add(gpu)  # one bad load: a relaunched worker on this GPU loads fine

            def update_weights(source="disk", *, on_done=None, **kw):
                on_done(OpResult(False, "injected: CUDA out of memory while loading weights"))
            worker.engine.update_weights = update_weights
    return misbehave


@pytest.mark.timeout(30)
async def test_failed_weight_push_keeps_the_fleet_on_one_reported_version(tiny_model_dir, tiny_model_variant_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0)
    async with running_cluster(config, launcher_factory=faulty(fail_first_weight_push_on("d0:1"))) as c:
        bad = next(w.slot for w in c.table.active() if "d0:1" in w.gpus)
        out = await c.admin("/update_weights", {"version": "v1", "model_path": str(tiny_model_variant_dir)})
        assert out["latest"] == "v1"
        assert "injected" in out["workers"][str(bad)]
        assert [r for s, r in out["workers"].items() if s != str(bad)] == ["ok", "ok"]
        # The failed worker is out of routing; every routable worker is on v1.
        assert bad not in [w.slot for w in c.table.active()]
        assert {w.weight_version for w in c.table.active()} == {"v1"}
        outs = await asyncio.gather(*(c.generate([7, i, 9], 4) for i in range(12)))
        assert {o["meta_info"]["weight_version"] for o in outs} == {"v1"}
        state = (await c.client.get(c.url + "/pearl/state", headers={"Authorization": "Bearer control-test-token"})).json()
        assert state["control"]["weights"]["version"] == "v1"


@pytest.mark.timeout(30)
async def test_worker_whose_weight_push_failed_catches_up_and_rejoins(tiny_model_dir, tiny_model_variant_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0)
    async with running_cluster(config, launcher_factory=faulty(fail_first_weight_push_on("d0:1"))) as c:
        await c.admin("/update_weights", {"version": "v1", "model_path": str(tiny_model_variant_dir)})
        await until(lambda: len(c.table.active()) == 3, timeout=10, what="the fleet to regain its worker")
        assert {w.weight_version for w in c.table.active()} == {"v1"}
        assert "d0:1" in {g for w in c.table.active() for g in w.gpus}


@pytest.mark.timeout(30)
async def test_push_that_fails_everywhere_leaves_the_fleet_serving_the_previous_version(tiny_model_dir, tmp_path):
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=0)
    async with running_cluster(config, launcher_factory=faulty(lambda *a: None)) as c:
        out = await c.admin("/update_weights", {"version": "v1", "model_path": str(tmp_path / "missing")})
        assert set(out["workers"]) == {"0", "1"} and "ok" not in out["workers"].values()
        assert len(c.table.active()) == 2
        assert {w.weight_version for w in c.table.active()} == {"default"}
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["weight_version"] == "default"


# -- a join whose worker dies during weight sync --------------------------------------------
def die_during_weight_sync(spec, worker, proxy):
    if any(g.startswith("die:") for g in spec.gpus):
        def update_weights(source="disk", *, on_done=None, **kw):
            proxy.set(Fault.RESET)  # the process is gone: every connection reset, no answer
        worker.engine.update_weights = update_weights


@pytest.mark.timeout(30)
@pytest.mark.parametrize("gpus", [["die:0"], ["ok:0", "die:0"]], ids=["alone", "with-a-healthy-peer"])
async def test_join_whose_worker_dies_during_weight_sync_admits_nothing(gpus, tiny_model_dir,
                                                                        tiny_model_variant_dir):
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=0)
    async with running_cluster(config, launcher_factory=faulty(die_during_weight_sync)) as c:
        await c.admin("/update_weights", {"version": "v1", "model_path": str(tiny_model_variant_dir)})
        loop = asyncio.get_running_loop()
        started = loop.time()
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": gpus})
        assert loop.time() - started < 10
        assert out["admitted"] == [] and out["cancelled"], out
        await c.settle()
        assert not [w for w in c.table.rollout_workers() if w.activity is Activity.JOINING]
        assert len(c.table.active()) == 2 and c.launcher.slots() == (0, 1)  # the joiners were stopped
        assert {w.weight_version for w in c.table.active()} == {"v1"}
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["weight_version"] == "v1"


# -- a reclaim whose worker refuses to drain --------------------------------------------------
async def _request_on_a_worker(c, ids, n):
    task = asyncio.ensure_future(c.generate(ids, n))
    st = c.app[ROUTER]
    await until(lambda: any(e.slots for e in st.inflight.matching(None)), what="the request to be routed")
    slot = next(e.slots[0] for e in st.inflight.matching(None) if e.slots)
    await until(lambda: c.launcher.worker(slot).engine.loads().num_running_reqs > 0, what="decoding to start")
    return task, slot


@pytest.mark.timeout(30)
@pytest.mark.parametrize("drain_s,deadline_s", [
    pytest.param(1.0, 10.0, id="drain-deadline-first"),
    pytest.param(30.0, 1.5, id="reclaim-deadline-first"),
])
async def test_reclaim_of_a_worker_that_refuses_to_drain_forces_it_off_keeping_partial_output(
        drain_s, deadline_s, tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=0, time_scale=2)
    config = replace(config, deadlines=replace(config.deadlines, drain_s=drain_s))
    ids, n = [2, 4, 6, 8, 10], 3000
    expected = await reference(tiny_model_dir, ids, n)
    async with running_cluster(config, launcher_factory=faulty(lambda *a: None)) as c:
        task, slot = await _request_on_a_worker(c, ids, n)
        try:
            c.launcher.worker(slot).engine.abort = lambda *a, **kw: None  # ignores every abort
            gpus = list(c.table.worker(slot).gpus)
            loop = asyncio.get_running_loop()
            started = loop.time()
            out = await c.admin("/pearl/gpus", {"action": "leave", "gpus": gpus, "deadline_s": deadline_s})
            elapsed = loop.time() - started
            assert out["removed"] == [slot]
            assert elapsed < min(drain_s, deadline_s) + 2.0, elapsed
            assert not c.launcher.alive(slot)
            assert not c.table.has(slot) or not c.table.worker(slot).is_member
            done = await task
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert done["output_ids"] == expected  # the partial trajectory was kept and continued
    assert done["meta_info"]["completion_tokens"] == n
    assert done["meta_info"]["pearl_attempts"] >= 2
