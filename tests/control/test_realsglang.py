"""The control plane driving real SGLang 0.5.23 servers on CPU (process launcher): a worker
added at runtime serves only at the latest weight version, an in-place prefill <-> decode
switch with requests served across it, a colocated <-> PD relaunch, and a weight push
broadcast over gloo by a trainer process through PEARL's weight group."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.control.launchers import LocalLauncher
from benchmarks.harness.servers import SglangCpuStack
from pearl_sglang.control.processes import free_port
from pearl_sglang.core.state import Activity, Role
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.dispatch import DispatchConfig
from tests.control.conftest import PROFILE, running_cluster
from tests.faults.support import until
from tests.support.workers import STACK_DIR

pytestmark = [pytest.mark.realsglang, pytest.mark.timeout(600)]

CPU_ARGS = ["--device", "cpu", "--dtype", "float32", "--max-total-tokens", "16384", "--sleep-on-idle",
            "--disable-overlap-schedule", "--disaggregation-decode-retraction-backup", "cpu_tensor"]


def real_config(model_dir, log_dir, *, dedicated, pd_mode) -> ClusterConfig:
    stack = SglangCpuStack.load(STACK_DIR)
    return ClusterConfig.from_mapping({
        "engine": {"kind": "sglang", "model_path": str(model_dir), "tp_size": 1, "memory_saver": False,
                   "python": stack.python, "env": dict(stack.env), "extra_args": CPU_ARGS,
                   "start_timeout_s": 300},
        "launcher": {"kind": "local", "log_dir": str(log_dir)},
        "zones": {"dedicated": [f"d0:{i}" for i in range(dedicated)], "overlap": []},
        "profile": PROFILE, "pd_mode": pd_mode, "gate": {"borrow": False},
        "deadlines": {"leave_s": 120, "drain_s": 30},
    })


def local(cluster, session):
    return LocalLauncher(cluster.engine, cluster.launcher, session)


def relaunching(table) -> list[int]:
    return [w.slot for w in table.rollout_workers() if w.activity is Activity.SWITCHING and not w.held]


async def generate(c, ids, n):
    """``c.generate`` with a client timeout as long as a relaunch can take."""
    r = await c.client.post(c.url + "/generate", timeout=400, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()


async def test_joined_worker_serves_only_at_latest_weights(tiny_model_dir, tiny_model_variant_dir, tmp_path):
    config = real_config(tiny_model_dir, tmp_path, dedicated=1, pd_mode="colocated")
    async with running_cluster(config, launcher_factory=local, settle_s=300) as c:
        pushed = await c.admin("/update_weights", {"version": "v2", "model_path": str(tiny_model_variant_dir),
                                                   "load_format": "auto"})
        assert pushed["workers"] == {"0": "ok"}
        ids = [21, 22, 23, 24]
        on_v2 = await c.generate(ids, 12)
        assert on_v2["meta_info"]["weight_version"] == "v2"
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]}, timeout=400)
        assert out["admitted"] == [1]
        joined = c.table.worker(1)
        assert joined.weight_version == "v2"
        info = (await c.client.get(joined.endpoint + "/model_info")).json()
        assert info["weight_version"] == "v2"
        direct = (await c.client.post(joined.endpoint + "/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True,
                                                  "temperature": 0}})).json()
        assert direct["output_ids"] == on_v2["output_ids"]  # the new worker really holds v2 weights


@pytest.mark.timeout(900)  # three starts and two relaunches, one after the other: 9 min on a loaded CPU
async def test_forced_in_place_switch_and_relaunch_on_real_sglang(tiny_model_dir, tmp_path):
    config = real_config(tiny_model_dir, tmp_path, dedicated=3, pd_mode="disaggregated")
    # Requests sent while nothing serves wait for a route as long as a relaunch can take.
    patient = RouterConfig(health_interval_s=3600, dispatch=DispatchConfig(route_wait_s=400))
    async with running_cluster(config, launcher_factory=local, settle_s=300, router_config=patient) as c:
        topo = c.table.active_topology()
        assert (topo.prefill, topo.decode) == (1, 2), topo
        ids = [5, 10, 15, 20, 25]
        expected = (await c.generate(ids, 20))["output_ids"]
        launches = c.launcher.launches
        flood = [asyncio.ensure_future(generate(c, ids, 300)) for _ in range(3)]  # moved, then waiting for a route
        await asyncio.sleep(0.5)
        prefill = c.table.active(Role.PREFILL)[0]
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": list(prefill.gpus), "deadline_s": 120})
        await c.settle(120)
        assert (c.table.active_topology().prefill, c.table.active_topology().decode) == (1, 1)
        assert c.launcher.launches == launches  # decode -> prefill in place, no relaunch
        flooded = await asyncio.gather(*flood)
        assert all(o["meta_info"]["completion_tokens"] == 300 for o in flooded), [o["meta_info"] for o in flooded]
        assert (await c.generate(ids, 20))["output_ids"] == expected
        # PD -> colocated relaunches: 1P1D keeps no serving path, so one worker relaunches
        # first (requests wait for it), then it serves while the other relaunches.
        change = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "colocated"}, timeout=400))
        await until(lambda: relaunching(c.table), timeout=120, what="the first wave to begin")
        during_first = [asyncio.ensure_future(generate(c, ids, 20)) for _ in range(2)]
        await until(lambda: c.table.active_topology().colocated == 1 and relaunching(c.table), timeout=400,
                    what="the first colocated worker to serve while the last one relaunches")
        during_last = await asyncio.gather(*(generate(c, ids, 20) for _ in range(2)))
        assert not change.done()  # served before the last wave is healthy
        out = await change
        assert [w["keeps_serving"] for w in out["waves"]] == [False, True], out
        assert c.table.active_topology().colocated == 2
        assert c.launcher.launches == launches + 2
        for o in [*during_last, *await asyncio.gather(*during_first)]:
            assert o["output_ids"] == expected
        assert (await c.generate(ids, 20))["output_ids"] == expected


async def _trainer(model_dir, spec_out, port, world_size, group):
    """The gloo trainer as a subprocess of the SGLang venv (torch lives there)."""
    stack = SglangCpuStack.load(STACK_DIR)
    env = {**os.environ, **stack.env, "GLOO_SOCKET_IFNAME": "lo"}
    return await asyncio.create_subprocess_exec(
        stack.python, str(Path(__file__).with_name("gloo_trainer.py")), str(model_dir), str(spec_out), str(port),
        str(world_size), group, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def test_distributed_push_over_gloo_serves_the_broadcast_weights(tiny_model_dir, tiny_model_variant_dir,
                                                                       tmp_path):
    config = real_config(tiny_model_dir, tmp_path, dedicated=1, pd_mode="colocated")
    async with running_cluster(config, launcher_factory=local, settle_s=300) as c:
        ids = [31, 32, 33, 34]
        before = (await c.generate(ids, 12))["output_ids"]
        port = free_port()
        group = await c.admin("/pearl/weight_group", {"action": "init", "group_name": "pearl_gloo",
                                                      "master_address": "127.0.0.1", "master_port": port,
                                                      "backend": "gloo"})
        assert group["world_size"] == 2 and group["members"] == [{"slot": 0, "rank_offset": 1}]
        spec_file = tmp_path / "spec.json"
        trainer = await _trainer(tiny_model_variant_dir, spec_file, port, group["world_size"], "pearl_gloo")
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while not spec_file.exists():
                assert trainer.returncode is None and loop.time() < deadline, "trainer did not start"
                await asyncio.sleep(0.2)
            spec = json.loads(spec_file.read_text())
            assert set(spec["dtypes"]) == {"float32"}
            started = loop.time()
            pushed = await c.admin("/update_weights", {"version": "v-dist", "distributed": {
                "group_name": "pearl_gloo", **spec}})
            push_s = loop.time() - started
            out, _ = await asyncio.wait_for(trainer.communicate(), 120)
            assert trainer.returncode == 0, out.decode(errors="replace")[-2000:]
        finally:
            if trainer.returncode is None:
                trainer.kill()
                await trainer.wait()
        assert pushed["workers"] == {"0": "ok"} and pushed["applied"], pushed
        worker = c.table.worker(0)
        assert worker.weight_version == "v-dist"
        info = (await c.client.get(worker.endpoint + "/model_info")).json()
        assert info["weight_version"] == "v-dist"
        on_dist = await c.generate(ids, 12)
        assert on_dist["meta_info"]["weight_version"] == "v-dist"
        assert on_dist["output_ids"] != before  # the broadcast really replaced the weights
        await c.admin("/pearl/weight_group", {"action": "destroy", "group_name": "pearl_gloo"})
        # The same weights loaded from disk give the same greedy output.
        await c.admin("/update_weights", {"version": "v-disk", "model_path": str(tiny_model_variant_dir),
                                          "load_format": "auto"})
        on_disk = await c.generate(ids, 12)
        assert on_disk["meta_info"]["weight_version"] == "v-disk"
        assert on_disk["output_ids"] == on_dist["output_ids"]
        print(f"distributed push of {len(spec['names'])} tensors took {push_s:.2f}s")
