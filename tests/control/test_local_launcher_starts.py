"""The process launcher tells a failed start from a slow one by the worker's own output:
a worker whose port was taken is started again on another port at once, a worker that
cannot run on this host fails at once with the setting to change, and neither waits for
``start_timeout_s``."""
from __future__ import annotations

import asyncio
import socket
import stat
from dataclasses import replace

import aiohttp
import pytest

from pearl_sglang.control.launchers import EngineCannotStart, LaunchSpec, LocalLauncher, PortInUse
from pearl_sglang.control.processes import PortPool, free_port, listen_ports
from pearl_sglang.control.start_failures import start_failure
from pearl_sglang.core.state import Role
from tests.control.conftest import cluster_config

pytestmark = pytest.mark.timeout(120)


def fake_engine(tmp_path, script: str):
    """An executable that stands in for the engine's Python: it ignores the arguments."""
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def launcher_for(config, session, tmp_path, **engine):
    config = replace(config, engine=replace(config.engine, start_timeout_s=300, **engine),
                     launcher=replace(config.launcher, log_dir=str(tmp_path / "logs")))
    return LocalLauncher(config.engine, config.launcher, session)


def held_port_first(monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", free_port()))
    busy.listen()
    taken = busy.getsockname()[1]
    picks = iter([taken])
    original = PortPool.take
    monkeypatch.setattr(PortPool, "take", lambda self, host="127.0.0.1": next(picks, None) or original(self, host))
    return busy, taken


async def test_a_worker_that_logs_a_taken_port_and_stays_alive_fails_fast(tiny_model_dir, tmp_path):
    # It also ignores SIGTERM, as SGLang does for ~10 s after a failed bind: a failed start
    # has nothing to drain, so it is not given the grace of a serving worker.
    python = fake_engine(tmp_path, "trap '' TERM\n"
                                   'echo "ERROR:    [Errno 98] error while attempting to bind on address '
                                   '(127.0.0.1, 1): address already in use"\nexec sleep 600\n')
    async with aiohttp.ClientSession() as session:
        launcher = launcher_for(cluster_config(tiny_model_dir), session, tmp_path, python=python)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PortInUse, match="address already in use"):
            await launcher.launch(LaunchSpec(0, Role.COLOCATED, ("d0:0",)))
        assert loop.time() - started < 10  # three attempts, not three start timeouts or grace periods
        assert launcher.launches == 3 and launcher.slots() == ()


async def test_an_emulated_worker_whose_port_is_held_starts_on_another_port(tiny_model_dir, tmp_path,
                                                                            monkeypatch):
    busy, taken = held_port_first(monkeypatch)
    try:
        async with aiohttp.ClientSession() as session:
            launcher = launcher_for(cluster_config(tiny_model_dir), session, tmp_path)
            try:
                launched = await launcher.launch(LaunchSpec(0, Role.COLOCATED, ("d0:0",)))
                assert not launched.endpoint.endswith(f":{taken}") and launcher.launches == 2
                async with session.get(launched.endpoint + "/health") as r:
                    assert r.status == 200
            finally:
                await launcher.stop_all()
    finally:
        busy.close()


async def test_memory_saver_without_cuda_says_what_to_change(tiny_model_dir, tmp_path):
    python = fake_engine(tmp_path, 'echo "OSError: libcuda.so.1: cannot open shared object file: '
                                   'No such file or directory"\nexit 1\n')
    async with aiohttp.ClientSession() as session:
        launcher = launcher_for(cluster_config(tiny_model_dir), session, tmp_path, python=python, memory_saver=True)
        with pytest.raises(EngineCannotStart, match="engine.memory_saver: false"):
            await launcher.launch(LaunchSpec(0, Role.COLOCATED, ("d0:0",)))
        assert launcher.launches == 1


def test_start_failures_are_read_from_the_output():
    assert start_failure("INFO: loading weights\nINFO: ready", memory_saver=True) is None
    assert isinstance(start_failure("OSError: [Errno 98] Address already in use", memory_saver=False), PortInUse)
    error = start_failure("ImportError: libcuda.so.1: cannot open shared object file", memory_saver=False)
    assert isinstance(error, EngineCannotStart) and "memory_saver" not in str(error).split(":")[0]


def test_listen_ports_avoid_the_ranges_sglang_and_ray_pick_from():
    ports = set(listen_ports())
    assert not ports & set(range(22000, 30000)) and not ports & set(range(10000, 20000))
    assert all(p < 32768 for p in ports) and len(ports) > 4000
