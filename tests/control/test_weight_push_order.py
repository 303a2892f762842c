"""Weight pushes one at a time: the snapshot joining workers sync to is always the latest
push some worker loaded, whatever order racing pushes finish in; workers that synced
before a push was adopted load it together before admission; a push with no worker to
load it is refused rather than recorded unchecked; the push count survives a restart."""
from __future__ import annotations

import asyncio

from hypothesis import given, strategies as st

from pearl_sglang.control.executor import PlanExecutor
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.core.state import Zone
from pearl_sglang.workers.client import WorkerClient
from tests.control.conftest import cluster_config, running_cluster


async def test_a_slow_bad_push_racing_a_good_one_leaves_joiners_on_the_good_one(
        tiny_model_dir, tiny_model_variant_dir, tmp_path, monkeypatch):
    bad_path = str(tmp_path / "missing")
    original = WorkerClient.update_from_disk
    loading = {"now": 0, "most": 0}

    async def update(self, url, **kw):
        loading["now"] += 1
        loading["most"] = max(loading["most"], loading["now"])
        try:
            if kw["model_path"] == bad_path:
                await asyncio.sleep(0.5)  # the bad one is slow to fail
            await original(self, url, **kw)
        finally:
            loading["now"] -= 1

    monkeypatch.setattr(WorkerClient, "update_from_disk", update)
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=1, overlap=0)) as c:
        bad = asyncio.ensure_future(c.admin("/update_weights", {"version": "v-bad", "model_path": bad_path}))
        await asyncio.sleep(0.05)
        good = asyncio.ensure_future(c.admin("/update_weights", {"version": "v-good",
                                                                  "model_path": str(tiny_model_variant_dir)}))
        bad_out, good_out = await asyncio.gather(bad, good)
        assert not bad_out["applied"] and good_out["applied"] and good_out["latest"] == "v-good"
        assert loading["most"] == 1  # never two pushes loading at once
        assert c.control.snapshot.version == "v-good"
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]})
        assert out["admitted"], out
        assert {w.weight_version for w in c.table.active()} == {"v-good"}
        outs = await asyncio.gather(*(c.generate([3, i, 5], 4) for i in range(12)))
        assert {o["meta_info"]["weight_version"] for o in outs} == {"v-good"}
        joined = c.table.worker(out["admitted"][0])
        assert c.control.pushes.servable(joined.weight_version)  # the router routes to it


async def test_borrowed_workers_that_synced_before_a_push_load_it_together(tiny_model_dir, tiny_model_variant_dir,
                                                                            monkeypatch):
    """The trainer pushes right after ``train_finished``, while the borrowed workers
    activate at the snapshot before it: each loads the push before it serves, and they
    load it at once (in a two-hour Qwen3-30B-A3B replay, one after another, the eight
    borrowed workers spent 160 s of a ~390 s rollout waiting for 20 s loads)."""
    loop = asyncio.get_running_loop()
    synced = asyncio.Event()
    activated: list[int] = []
    loads: dict[str, list[tuple[float, float]]] = {}
    original_update, original_activate = WorkerClient.update_from_disk, PlanExecutor.activate

    async def update(self, url, **kw):
        if kw["version"] == "v9":
            await synced.wait()  # the push is adopted only after every activation synced
        start = loop.time()
        await asyncio.sleep(0.3)
        await original_update(self, url, **kw)
        loads.setdefault(url, []).append((start, loop.time()))

    async def activate(self, add, operation):
        ready = await original_activate(self, add, operation)
        activated.append(add.slot)
        if len(activated) == 4:
            synced.set()
        return ready

    monkeypatch.setattr(WorkerClient, "update_from_disk", update)
    monkeypatch.setattr(PlanExecutor, "activate", activate)
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=4)) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})
        push = await c.admin("/update_weights", {"version": "v9", "model_path": str(tiny_model_variant_dir)})
        assert push["applied"] and sorted(push["workers"]) == ["0", "1"], push  # the serving ones
        await c.settle()
        borrowed = [w for w in c.table.active() if w.zone is Zone.OVERLAP]
        assert len(borrowed) == 4 and {w.weight_version for w in c.table.active()} == {"v9"}
        catch_ups = [loads[w.endpoint][-1] for w in borrowed]
        # Together: every load began before any ended (one after another, none would overlap).
        assert max(start for start, _ in catch_ups) < min(end for _, end in catch_ups), catch_ups
        outs = await asyncio.gather(*(c.generate([4, i, 6], 4) for i in range(12)))
        assert {o["meta_info"]["weight_version"] for o in outs} == {"v9"}


async def test_a_push_with_no_active_worker_is_refused_and_changes_nothing(tiny_model_dir, tmp_path):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=1, overlap=0)) as c:
        await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]})
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": ["d0:0", "p1:0"], "deadline_s": 10})
        assert not c.table.active()
        err = await c.admin("/update_weights", {"version": "v-x", "model_path": str(tmp_path / "missing")},
                            expect=503)
        assert err["error"]["type"] == "no_active_worker", err
        assert c.control.snapshot.version == "default" and c.control.pushes.number == 0
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p2:0"]})
        assert out["admitted"], out  # the joiner syncs to a snapshot that loads
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["weight_version"] == "default"


@given(pushes=st.lists(st.sampled_from(["v1", "v2", "v3"]), max_size=8), bound=st.integers(0, 3),
       reported=st.lists(st.sampled_from(["v1", "v2", "v3", "v-late"]), max_size=3))
def test_the_push_log_survives_its_record(pushes, bound, reported):
    log = PushLog.start("v0", max_staleness=bound)
    for v in pushes:
        log = log.adopt(v)
    restored = PushLog.from_dict(log.to_dict(), max_staleness=bound, also=tuple(reported))
    assert restored.number == log.number == len(pushes)
    for v in ["v0", "v1", "v2", "v3"]:
        assert restored.lag(v) == log.lag(v) or (v in reported and log.lag(v) is None and restored.lag(v) == 0)
    assert all(restored.servable(v) for v in reported)
