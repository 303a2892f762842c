"""Inter-scale elasticity and role changes on emulated clusters, with the table checked
after every step and every accepted request completing with the right tokens."""
from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from pearl_sglang.control.launchers import LaunchError
from pearl_sglang.core.state import Activity, Role, is_gpu_id
from pearl_sglang.workers.client import WorkerClient
from tests.control.conftest import cluster_config, running_cluster
from tests.support.emulated import emulator


class SlowLauncher(InProcessEmulatorLauncher):
    """Cold starts that take a while, so events can arrive during an expansion."""

    delay_s = 1.0

    async def launch(self, spec):
        await asyncio.sleep(self.delay_s)
        return await super().launch(spec)


class FailingLauncher(InProcessEmulatorLauncher):
    """Workers on GPUs of node 'bad' never come up."""

    async def launch(self, spec):
        if any(g.startswith("bad:") for g in spec.gpus):
            await asyncio.sleep(0.2)
            raise LaunchError(f"injected start failure on {spec.gpus}")
        return await super().launch(spec)


async def reference(model_dir, ids, n):
    async with emulator("--model-path", str(model_dir), "--profile", "tiny", "--time-scale", "50") as (url, _):
        async with httpx.AsyncClient(timeout=60) as c:
            r = await c.post(url + "/generate", json={"input_ids": ids, "sampling_params": {
                "max_new_tokens": n, "ignore_eos": True}})
            return r.json()["output_ids"]


async def test_join_is_admitted_atomically_at_latest_weights(tiny_model_dir, tiny_model_variant_dir):
    async with running_cluster(cluster_config(tiny_model_dir, overlap=0), launcher_cls=SlowLauncher) as c:
        join = asyncio.ensure_future(c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0", "p2:0"]}))
        await asyncio.sleep(0.3)
        joining = [w for w in c.table.rollout_workers() if w.activity is Activity.JOINING]
        assert len(joining) == 2  # preparing in the background while the others serve
        assert (await c.generate([4, 5, 6]))["meta_info"]["completion_tokens"] == 16
        pushed = await c.admin("/update_weights", {"version": "v1", "model_path": str(tiny_model_variant_dir)})
        assert set(pushed["workers"].values()) == {"ok"}
        out = await join
        assert sorted(out["admitted"]) == [2, 3] and not out["cancelled"]
        assert [w.weight_version for w in c.table.active()] == ["v1"] * 4
        for _ in range(8):
            assert (await c.generate([9, 9]))["meta_info"]["weight_version"] == "v1"


async def test_a_join_with_one_failing_worker_admits_nothing(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, overlap=0), launcher_cls=FailingLauncher) as c:
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["ok1:0", "bad:0"]})
        assert out["admitted"] == [] and out["cancelled"]
        await c.settle()
        assert len(c.table.active()) == 2
        assert c.launcher.slots() == (0, 1)  # the worker that did start was stopped again


async def test_train_begin_during_an_expansion_answers_in_time(tiny_model_dir):
    config = cluster_config(tiny_model_dir, overlap=2)
    async with running_cluster(config, launcher_cls=SlowLauncher) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})      # borrowing starts: slow launches
        join = asyncio.ensure_future(c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]}))
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await c.admin("/train_begin", {"step": 1})
        assert loop.time() - t0 < config.deadlines.train_begin_s
        assert c.table.training_owns_overlap
        assert not [w for w in c.table.rollout_workers() if w.zone.value == "overlap" and w.is_member]
        await join
        await c.settle()
        # The joined GPU is used once the mandatory return is done.
        assert {"p1:0"} <= {g for w in c.table.active() for g in w.gpus}
        assert out["returned_gpus"] == ["t0:0", "t0:1"]


async def test_losing_the_last_prefill_forces_a_switch(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0, pd_mode="disaggregated")
    async with running_cluster(config) as c:
        topo = c.table.active_topology()
        assert topo.prefill >= 1 and topo.decode >= 1 and topo.colocated == 0
        ids = [3, 1, 4, 1, 5]
        expected = await reference(tiny_model_dir, ids, 40)
        prefill = c.table.active(Role.PREFILL)
        flood = [asyncio.ensure_future(c.generate(ids, 40)) for _ in range(6)]
        await asyncio.sleep(0.05)
        gone = [g for w in prefill for g in w.gpus]
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": gone, "deadline_s": 20})
        await c.settle()
        topo = c.table.active_topology()
        assert topo.prefill >= 1 and topo.decode >= 1, topo
        assert [o["output_ids"] for o in await asyncio.gather(*flood)] == [expected] * 6
        assert (await c.generate(ids, 40))["output_ids"] == expected
        decisions = c.control.decisions
        assert any(d.get("forced") for d in decisions if "forced" in d)


@pytest.mark.timeout(240)
async def test_burst_of_200_random_events_keeps_invariants_and_requests(tiny_model_dir):
    rng = random.Random(2026)
    config = cluster_config(tiny_model_dir, dedicated=2, overlap=2, time_scale=50)
    async with running_cluster(config) as c:
        joined: list[str] = []
        training = False
        step = 0
        prompts = [[rng.randrange(10, 900) for _ in range(8)] for _ in range(20)]
        requests = []
        counts = {"join": 0, "leave": 0, "train": 0, "weights": 0}

        async def traffic():
            while True:
                i = rng.randrange(len(prompts))
                requests.append((i, asyncio.ensure_future(c.generate(prompts[i], 24))))
                await asyncio.sleep(0.01)

        pump = asyncio.ensure_future(traffic())
        try:
            for k in range(200):
                choice = rng.random()
                if choice < 0.25:
                    gpu = f"p{k}:0"
                    await c.admin("/pearl/gpus", {"action": "join", "gpus": [gpu]})
                    joined.append(gpu)
                    counts["join"] += 1
                elif choice < 0.45 and joined:
                    gpu = joined.pop(rng.randrange(len(joined)))
                    await c.admin("/pearl/gpus", {"action": "leave", "gpus": [gpu], "deadline_s": 20})
                    counts["leave"] += 1
                elif choice < 0.75:
                    if training:
                        await c.admin("/train_finished", {"step": step})
                        step += 1
                    else:
                        await c.admin("/train_begin", {"step": step})
                        assert c.table.training_owns_overlap
                    training = not training
                    counts["train"] += 1
                elif choice < 0.85:
                    await c.admin("/update_weights", {"version": f"v{k}", "model_path": str(tiny_model_dir)})
                    counts["weights"] += 1
                else:
                    await asyncio.sleep(0.05)
            await c.settle(60)
        finally:
            pump.cancel()
        outs = await asyncio.gather(*(t for _, t in requests), return_exceptions=True)
    errors = [o for o in outs if isinstance(o, BaseException)]
    assert not errors, errors[:3]
    assert len(outs) > 100 and min(counts.values()) >= 10, counts
    assert all(o["meta_info"]["completion_tokens"] == 24 for o in outs)


async def test_operator_switches_colocated_to_pd_and_back(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=3, overlap=0)) as c:
        ids = [8, 6, 7, 5, 3, 0, 9]
        expected = await reference(tiny_model_dir, ids, 30)
        out = await c.admin("/pearl/pd_mode", {"pd_mode": "disaggregated"})
        topo = c.table.active_topology()
        assert topo.colocated == 0 and topo.prefill >= 1 and topo.decode >= 1, out
        assert (await c.generate(ids, 30))["output_ids"] == expected
        await c.admin("/pearl/pd_mode", {"pd_mode": "colocated"})
        assert c.table.active_topology().colocated == 3
        assert (await c.generate(ids, 30))["output_ids"] == expected
        await c.admin("/pearl/pd_mode", {"pd_mode": "2:1"})  # a pinned ratio, through the relaunch path
        topo = c.table.active_topology()
        assert (topo.prefill, topo.decode) == (2, 1), topo
        assert (await c.generate(ids, 30))["output_ids"] == expected
        for bad in ("sideways", "0:3", 3, "\u00b2:1", "1:\u0661", "99999:1"):  # '²' was a 500 (fuzz)
            await c.admin("/pearl/pd_mode", {"pd_mode": bad}, expect=400)
        # GPU ids the fuzz got admitted into the budget: each must be refused.
        for bad in ([":"], ["x:"], ["\u0000:0"], [" :0"], ["a:b:c"], ["n:" + "9" * 300], ["n:\u00b2"], []):
            err = await c.admin("/pearl/gpus", {"action": "join", "gpus": bad}, expect=400)
            assert "GPU ids" in err["error"]["message"], (bad, err)
        assert all(map(is_gpu_id, c.table.dedicated_gpus | c.table.overlap_gpus))


async def test_a_worker_that_leaves_during_a_weight_push_is_not_updated(tiny_model_dir, tiny_model_variant_dir,
                                                                        monkeypatch):
    # Found by the elastic replay: a preempted worker left while a push was loading, and
    # recording the new version on its (gone) slot failed the whole push with a 409.
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=0)) as c:
        await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]})
        loading, release = asyncio.Event(), asyncio.Event()
        original = WorkerClient.update_from_disk

        async def slow_update(self, url, **kw):
            await original(self, url, **kw)
            loading.set()
            await release.wait()

        monkeypatch.setattr(WorkerClient, "update_from_disk", slow_update)
        push = asyncio.ensure_future(c.admin("/update_weights", {"version": "v1",
                                                                  "model_path": str(tiny_model_variant_dir)}))
        await loading.wait()
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": ["p1:0"], "deadline_s": 10})
        release.set()
        out = await push
        assert out["applied"] and out["latest"] == "v1", out
        assert not c.table.has(2) or c.table.worker(2).activity != Activity.ACTIVE
        assert {w.weight_version for w in c.table.active()} == {"v1"}
        assert (await c.generate([1, 2, 3], 8))["meta_info"]["weight_version"] == "v1"


async def test_in_process_launch_chooses_another_port_when_its_port_was_taken(tiny_model_dir, monkeypatch):
    # Found in CI: two parallel benchmark processes picked the same free port; the second bind
    # failed and the whole bootstrap was cancelled.
    import socket

    from pearl_sglang.control.launchers import LaunchSpec
    from pearl_sglang.control.processes import PortPool, free_port
    from pearl_sglang.core.state import Role

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    picks = iter([taken])
    monkeypatch.setattr(PortPool, "take", lambda self, host="127.0.0.1": next(picks, None) or free_port(host))
    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0)
    launcher = InProcessEmulatorLauncher(config.engine)
    try:
        launched = await launcher.launch(LaunchSpec(slot=0, gpus=("d0:0",), role=Role.COLOCATED))
        assert not launched.endpoint.endswith(f":{taken}")
        async with httpx.AsyncClient(timeout=30) as c:
            assert (await c.get(launched.endpoint + "/health")).status_code == 200
    finally:
        await launcher.stop_all()
        busy.close()
