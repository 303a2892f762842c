"""The staleness bound: pushes numbered as adopted (pure ``PushLog`` properties), the
selector skipping workers beyond the bound, and on an emulated cluster a worker that
missed pushes serving while within the bound, then kept out of routing and replaced,
while requests keep completing on the others."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import given, strategies as st

from pearl_sglang.control.cluster_config import ConfigError
from pearl_sglang.control.launchers import LaunchedWorker, LaunchSpec
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.state import Activity, Role, StateTable, WorkerRecord, Zone
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from pearl_sglang.emulator.request import OpResult
from pearl_sglang.core.placement import WorkerLoad
from pearl_sglang.router.selection import NoRoute, Selector
from pearl_sglang.router.state import ROUTER
from tests.control.conftest import cluster_config, running_cluster
from tests.faults.support import until

versions = st.lists(st.sampled_from([f"v{i}" for i in range(6)]), max_size=20)


@given(start=st.sampled_from(["v0", "default"]), pushes=versions, bound=st.integers(0, 4))
def test_push_log_lag_counts_adopted_pushes(start, pushes, bound):
    log = PushLog.start(start, max_staleness=bound)
    for v in pushes:
        before = {u: log.lag(u) for u in log.versions}
        log = log.adopt(v)
        assert log.lag(v) == 0 and log.servable(v)
        for u, lag in before.items():  # every other version falls one push further behind
            if u != v and log.lag(u) is not None:  # (None: fell out of the bound)
                assert log.lag(u) == lag + 1
        assert len(log.pushes) <= bound + 1
        assert all(log.servable(u) == (log.lag(u) is not None and log.lag(u) <= bound) for u in log.versions)
    assert log.number == len(pushes)
    assert not log.servable("never-adopted") and not log.servable(None)


def test_after_a_restart_every_version_the_workers_report_is_current():
    log = PushLog.start("v3", also=("v4",))
    assert log.lag("v3") == log.lag("v4") == 0
    log = log.adopt("v5")
    assert not log.servable("v3") and not log.servable("v4") and log.servable("v5")


def test_push_log_and_config_reject_a_negative_bound(tiny_model_dir):
    with pytest.raises(ValueError):
        PushLog.start("v0", max_staleness=-1)
    with pytest.raises(ConfigError, match="max_staleness"):
        cluster_config(tiny_model_dir, weights={"max_staleness": -1})
    with pytest.raises(ConfigError, match="unknown key"):
        cluster_config(tiny_model_dir, weights={"max_stale": 1})


def _table(*versions_by_slot):
    workers = [WorkerRecord(slot=i, gpus=(f"d0:{i}",), zone=Zone.DEDICATED, role=Role.COLOCATED,
                            activity=Activity.ACTIVE, weight_version=v, endpoint=f"http://w{i}")
               for i, v in enumerate(versions_by_slot)]
    return StateTable.create(tp_size=1, dedicated_gpus=[w.gpus[0] for w in workers], workers=workers)


def test_selector_skips_workers_beyond_the_bound():
    log = PushLog.start("v0", max_staleness=1).adopt("v1").adopt("v2")
    table = _table("v2", "v0", "v1")
    selector = Selector(pushes=lambda: log)
    # Slot 1 is idle, yet two pushes behind: the least loaded servable worker wins.
    assert selector.choose(table, loads={0: WorkerLoad(running=5), 2: WorkerLoad(running=3)},
                           key=()).worker.slot == 2
    with pytest.raises(NoRoute):
        selector.choose(table, loads={}, key=(), exclude={0, 2})  # slot 1 is two pushes behind
    assert Selector().choose(table, loads={}, key=(), exclude={0, 2}).worker.slot == 1  # no bound


@dataclass
class StubbornLauncher(InProcessEmulatorLauncher):
    """The first worker on GPU ``d0:1`` fails every weight load; a relaunch loads fine."""

    broken: set[str] = field(default_factory=set)

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        launched = await super().launch(spec)
        if "d0:1" in spec.gpus and "d0:1" not in self.broken:
            self.broken.add("d0:1")

            def update_weights(source="disk", *, on_done=None, **kw):
                on_done(OpResult(False, "injected: out of memory while loading weights"))
            self.worker(spec.slot).engine.update_weights = update_weights
        return launched


def routed(c, slot):
    return c.app[ROUTER].metrics.routed.labels(str(slot), "colocated")._value.get()


@pytest.mark.timeout(60)
async def test_lagging_worker_serves_within_the_bound_then_leaves_routing_and_is_replaced(
        tiny_model_dir, tiny_model_variant_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0, weights={"max_staleness": 1})
    async with running_cluster(config, launcher_cls=StubbornLauncher) as c:
        bad = next(w.slot for w in c.table.active() if "d0:1" in w.gpus)
        out = await c.admin("/update_weights", {"version": "v1", "model_path": str(tiny_model_variant_dir)})
        assert "injected" in out["workers"][str(bad)] and out["applied"]
        assert c.table.worker(bad).weight_version == "default"  # one push behind: still serving
        before = routed(c, bad)
        await asyncio.gather(*(c.generate([i, 2, 3], 4) for i in range(9)))
        assert routed(c, bad) > before
        # Hold the control plane so that the repair waits: the stale worker stays in the
        # table, and only routing keeps requests off it.
        async with c.control.lock:  # the test holds the shell still
            push = asyncio.ensure_future(c.admin("/update_weights", {"version": "v2",
                                                                     "model_path": str(tiny_model_dir)}))
            await until(lambda: c.control.pushes.number == 2, what="the push to be adopted")
            assert c.table.worker(bad).activity is Activity.ACTIVE
            before = routed(c, bad)
            outs = await asyncio.gather(*(c.generate([i, 5, 6], 4) for i in range(12)))
            assert {o["meta_info"]["weight_version"] for o in outs} == {"v2"}
            assert routed(c, bad) == before
            # Readiness counts what routing can use (a stale only prefill was "ready").
            ready = (await c.client.get(c.url + "/readiness")).json()
            assert ready["stale_workers"] == [bad] and ready["healthy_workers"] == 2, ready
        out = await push
        assert "injected" in out["workers"][str(bad)]
        await until(lambda: len(c.table.active()) == 3 and all(
            w.weight_version == "v2" for w in c.table.active()), timeout=20, what="the replacement")
        await c.settle()
        assert "d0:1" in {g for w in c.table.active() for g in w.gpus}
        state = (await c.client.get(c.url + "/pearl/state", headers=c.auth)).json()["control"]
        assert state["pushes"] == {"number": 2, "max_staleness": 1, "servable_versions": ["v1", "v2"]}
