"""Failed starts and memory release against real SGLang 0.5.23 on CPU: a worker whose port
another process holds is started again on another port, the memory saver on a CPU build
fails the start with the setting to change, and a worker without the memory saver is
stopped when its borrowed GPU is returned."""
from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import aiohttp
import pytest

from pearl_sglang.control.cluster_config import ConfigError
from pearl_sglang.control.launchers import EngineCannotStart, LaunchSpec, LocalLauncher
from pearl_sglang.control.processes import PortPool, free_port
from pearl_sglang.core.state import Zone
from pearl_sglang.core.state import Role
from tests.control.conftest import PROFILE, running_cluster
from tests.control.test_realsglang import real_config

pytestmark = [pytest.mark.realsglang, pytest.mark.timeout(600)]


async def test_a_real_worker_whose_port_another_process_holds_starts_on_another_port(
        tiny_model_dir, tmp_path, monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", free_port()))
    holder.listen()
    taken = holder.getsockname()[1]
    picks = iter([taken])
    original = PortPool.take
    monkeypatch.setattr(PortPool, "take", lambda self, host="127.0.0.1": next(picks, None) or original(self, host))
    config = real_config(tiny_model_dir, tmp_path, dedicated=1, pd_mode="colocated")
    try:
        async with aiohttp.ClientSession() as session:
            launcher = LocalLauncher(config.engine, config.launcher, session)
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                launched = await launcher.launch(LaunchSpec(0, Role.COLOCATED, ("d0:0",)))
                elapsed = loop.time() - started
                assert launcher.launches == 2 and not launched.endpoint.endswith(f":{taken}")
                async with session.post(launched.endpoint + "/generate", json={
                        "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}) as r:
                    assert r.status == 200 and len((await r.json())["output_ids"]) == 4
            finally:
                await launcher.stop_all()
    finally:
        holder.close()
    assert elapsed < config.engine.start_timeout_s
    print(f"failed start detected and relaunched on another port in {elapsed:.1f}s")


async def test_the_memory_saver_on_a_cpu_build_says_what_to_change(tiny_model_dir, tmp_path):
    config = real_config(tiny_model_dir, tmp_path, dedicated=1, pd_mode="colocated")
    engine = replace(config.engine, memory_saver=True)
    async with aiohttp.ClientSession() as session:
        launcher = LocalLauncher(engine, config.launcher, session)
        try:
            with pytest.raises(EngineCannotStart, match="engine.memory_saver: false"):
                await launcher.launch(LaunchSpec(0, Role.COLOCATED, ("d0:0",)))
        finally:
            await launcher.stop_all()
    assert launcher.slots() == ()


async def test_a_real_worker_without_the_memory_saver_is_stopped_when_its_gpu_returns(tiny_model_dir, tmp_path):
    config = real_config(tiny_model_dir, tmp_path, dedicated=1, pd_mode="colocated")
    with pytest.raises(ConfigError, match="zones.overlap needs engine.memory_saver"):
        config.from_mapping({**_mapping(config, tiny_model_dir), "zones": {"dedicated": ["d0:0"],
                                                                           "overlap": ["t0:0"]}})
    # The same workers under a config that claims an overlap zone anyway (the check at load
    # bypassed): the control plane must not trust the release.
    config = replace(config, zones=replace(config.zones, overlap=("t0:0",)),
                     gate=replace(config.gate, borrow=True, enabled=False))

    def local(cluster, session):
        return LocalLauncher(cluster.engine, cluster.launcher, session)

    async with running_cluster(config, launcher_factory=local, settle_s=300) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})
        await c.settle(300)
        borrowed = [w.slot for w in c.table.active() if w.zone is Zone.OVERLAP]
        assert borrowed and all(c.launcher.alive(s) for s in borrowed)
        await c.admin("/train_begin", {"step": 1})
        assert not any(c.launcher.alive(s) for s in borrowed), "a worker that freed nothing still runs"
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["completion_tokens"] == 4


def _mapping(config, model_dir):
    e = config.engine
    return {"engine": {"kind": "sglang", "model_path": str(model_dir), "memory_saver": False, "python": e.python,
                       "env": dict(e.env), "extra_args": list(e.extra_args)},
            "profile": PROFILE}
