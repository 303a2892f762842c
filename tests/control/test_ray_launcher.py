"""The control plane on a local Ray cluster: emulated workers run as Ray actors placed by
their node's ``pearl_node:<node>`` resource, relaunched by a colocated <-> PD switch with
requests served across it, and removed (actor and process) when their GPUs leave.

Ray is a test dependency: without it this module fails to import, it does not skip."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import ray

from pearl_sglang.control.cluster_config import LauncherConfig
from pearl_sglang.control.launchers import LaunchError, LaunchSpec
from pearl_sglang.control import ray_launcher as ray_launcher_module
from pearl_sglang.control.ray_launcher import RayLauncher, reserve_ports
from pearl_sglang.core.state import Role
from tests.control.conftest import cluster_config, running_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_cluster():
    """One small local Ray node that holds node ``d0``'s GPUs (and no other node's)."""
    ray.init(num_cpus=2, resources={"pearl_node:d0": 8}, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 1024 * 1024, namespace="pearl-ray-launcher-test")
    try:
        yield
    finally:
        ray.shutdown()


def ray_launcher(cluster, session) -> RayLauncher:
    return RayLauncher(cluster.engine, cluster.launcher, session)


def worker_pids(marker: str) -> set[int]:
    """Emulator processes whose command line holds ``marker`` (this test's model path)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pearl_sglang.emulator" in argv and any(marker.encode() in a for a in argv):
            pids.add(int(proc.name))
    return pids


async def eventually(check, timeout: float = 20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


def named_workers() -> set[str]:
    return {n for n in ray.util.list_named_actors() if n.startswith("pearl-worker-")}


def actors_match(launcher: RayLauncher) -> bool:
    return named_workers() == {launcher.actor_name(s) for s in launcher.slots()}


async def test_workers_as_ray_actors_launch_switch_and_leave(ray_cluster, tiny_model_dir, tmp_path):
    model = tmp_path / "model"  # a path of our own marks this test's worker processes
    model.symlink_to(tiny_model_dir, target_is_directory=True)
    config = cluster_config(model, dedicated=2, overlap=0, time_scale=50,
                            launcher={"kind": "ray", "log_dir": str(tmp_path / "logs")})
    async with running_cluster(config, launcher_factory=ray_launcher, settle_s=120) as c:
        launcher: RayLauncher = c.launcher
        node_ip = ray.util.get_node_ip_address()
        assert c.table.active_topology().colocated == 2
        assert launcher.slots() == (0, 1) and all(launcher.alive(s) for s in (0, 1))
        assert actors_match(launcher) and len(named_workers()) == 2
        assert all(w.endpoint == f"http://{node_ip}:{w.endpoint.rsplit(':', 1)[1]}" for w in c.table.active())
        assert len(worker_pids(str(model))) == 2
        assert len(list((tmp_path / "logs").glob("worker-*.log"))) == 2

        ids = [8, 6, 7, 5, 3, 0, 9]
        expected = (await c.generate(ids, 30))["output_ids"]
        launches = launcher.launches
        flood = [asyncio.ensure_future(c.generate(ids, 30)) for _ in range(4)]
        await asyncio.sleep(0.05)
        await c.admin("/pearl/pd_mode", {"pd_mode": "disaggregated"})
        topo = c.table.active_topology()
        assert (topo.colocated, topo.prefill, topo.decode) == (0, 1, 1), topo
        assert launcher.launches > launches  # colocated -> PD relaunches on fresh actors
        assert all(w.bootstrap_port for w in c.table.active(Role.PREFILL))
        await eventually(lambda: actors_match(launcher))
        assert (await c.generate(ids, 30))["output_ids"] == expected
        assert [o["output_ids"] for o in await asyncio.gather(*flood)] == [expected] * 4

        await c.admin("/pearl/pd_mode", {"pd_mode": "colocated"})
        assert c.table.active_topology().colocated == 2
        await eventually(lambda: actors_match(launcher) and len(worker_pids(str(model))) == 2)
        assert (await c.generate(ids, 30))["output_ids"] == expected

        gone = c.table.worker(1)
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": list(gone.gpus), "deadline_s": 20})
        await c.settle(60)
        assert launcher.slots() == (0,) and not launcher.alive(1)
        await eventually(lambda: actors_match(launcher) and len(named_workers()) == 1)
        await eventually(lambda: len(worker_pids(str(model))) == 1)
        assert (await c.generate(ids, 30))["output_ids"] == expected

        # GPUs on a node that no Ray node offers: refused at once, nothing left behind.
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["nowhere:0"]})
        assert out["admitted"] == [] and out["cancelled"], out
        await c.settle()
        assert launcher.slots() == (0,) and len(named_workers()) == 1
    await eventually(lambda: not named_workers())
    await eventually(lambda: not worker_pids(str(model)))


async def test_a_worker_that_dies_during_start_fails_with_its_log(ray_cluster, tiny_model_dir, tmp_path):
    config = cluster_config(tiny_model_dir, dedicated=1, overlap=0)
    engine = replace(config.engine, emulator={"profile": "no-such-profile"}, start_timeout_s=60)
    async with aiohttp.ClientSession() as session:
        launcher = RayLauncher(engine, LauncherConfig(kind="ray", log_dir=str(tmp_path)), session)
        with pytest.raises(LaunchError, match="one worker's GPUs must share a node"):
            await launcher.launch(LaunchSpec(slot=0, role=Role.COLOCATED, gpus=("d0:0", "d1:0")))
        with pytest.raises(LaunchError, match="exited during start") as failed:
            await launcher.launch(LaunchSpec(slot=0, role=Role.COLOCATED, gpus=("d0:3",)))
        assert "no-such-profile" in str(failed.value)  # the tail of the worker's log, read on its node
        assert launcher.slots() == () and launcher.launches == 1
    await eventually(lambda: not named_workers())


def test_ports_reserved_by_a_live_actor_are_not_handed_out_again(tmp_path, monkeypatch):
    picks = iter([5001, 5001, 5002, 5003, 5004])
    monkeypatch.setattr(ray_launcher_module, "free_port", lambda host: next(picks))
    monkeypatch.setattr(ray_launcher_module.tempfile, "gettempdir", lambda: str(tmp_path))
    assert reserve_ports("127.0.0.1", 1) == [5001]  # held by this (live) process
    assert reserve_ports("127.0.0.1", 2) == [5002, 5003]  # 5001 came back from the kernel: skipped
    table = tmp_path / "pearl-ray-ports.json"
    table.write_text('{"5004": 999999999}')  # a holder that no longer exists
    assert reserve_ports("127.0.0.1", 1) == [5004]
