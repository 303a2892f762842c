"""Start and stop rollout worker processes for the control plane.

A launcher turns a ``LaunchSpec`` (slot, role, GPUs, weight version) into a running,
healthy worker and back. ``LocalLauncher`` runs processes on this host (GPUs through
``CUDA_VISIBLE_DEVICES``, free ports, one log per worker, stopped by process group);
``RayLauncher`` (``ray_launcher``) runs them as Ray actors on the node that holds the
GPUs; attach mode has no launcher at all (ratio changes only through ``/pd_role_switch``).
"""
from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp

from pearl_sglang.control.cluster_config import EngineConfig, LauncherConfig
from pearl_sglang.control.processes import ServerProcess, ServerSpec, free_port
from pearl_sglang.engine.launch_args import EngineArgs, LaunchRole, server_args


class LaunchError(RuntimeError):
    """A worker did not start or did not become healthy in time."""


@dataclass(frozen=True)
class LaunchSpec:
    slot: int
    role: LaunchRole
    gpus: tuple[str, ...]
    weight_version: str | None = None


@dataclass(frozen=True)
class LaunchedWorker:
    slot: int
    endpoint: str
    bootstrap_port: int | None


class Launcher(Protocol):
    async def launch(self, spec: LaunchSpec) -> LaunchedWorker: ...

    async def stop(self, slot: int) -> None: ...

    def alive(self, slot: int) -> bool: ...

    def slots(self) -> tuple[int, ...]: ...


def engine_args(engine: EngineConfig, spec: LaunchSpec, *, host: str, port: int,
                bootstrap_port: int | None) -> list[str]:
    """The flags of one worker: the same for SGLang and the emulator, plus the emulator's own."""
    args = server_args(
        EngineArgs(model_path=engine.model_path or ".", tp_size=engine.tp_size,
                   transfer_backend=engine.transfer_backend, enable_memory_saver=engine.memory_saver,
                   enable_weights_cpu_backup=engine.weights_cpu_backup, extra=tuple(engine.extra_args)),
        role=spec.role, host=host, port=port, bootstrap_port=bootstrap_port,
        weight_version=spec.weight_version)
    if engine.kind == "emulator":
        args += [f"--{k.replace('_', '-')}={v}" for k, v in sorted(dict(engine.emulator).items())]
    return args


def engine_argv(engine: EngineConfig, spec: LaunchSpec, *, host: str, port: int,
                bootstrap_port: int | None) -> list[str]:
    """The command line of one worker process."""
    python = engine.python or sys.executable
    module = "sglang.launch_server" if engine.kind == "sglang" else "pearl_sglang.emulator"
    return [python, "-m", module, *engine_args(engine, spec, host=host, port=port, bootstrap_port=bootstrap_port)]


def visible_devices(gpus: tuple[str, ...]) -> str:
    nodes = {g.split(":", 1)[0] for g in gpus}
    if len(nodes) != 1:
        raise LaunchError(f"one worker's GPUs must share a node, got {list(gpus)}")
    return ",".join(g.split(":", 1)[1] for g in gpus)


async def wait_healthy(session: aiohttp.ClientSession, url: str, *, alive, timeout_s: float,
                       describe) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if not alive():
            raise LaunchError(f"worker exited during start:\n{describe()}")
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            pass
        if loop.time() > deadline:
            raise LaunchError(f"worker not healthy after {timeout_s:.0f}s:\n{describe()}")
        await asyncio.sleep(0.2)


class LocalLauncher:
    def __init__(self, engine: EngineConfig, launcher: LauncherConfig, session: aiohttp.ClientSession) -> None:
        self.engine = engine
        self.config = launcher
        self.session = session
        self._procs: dict[int, ServerProcess] = {}
        self.launches = 0

    def slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._procs))

    def alive(self, slot: int) -> bool:
        proc = self._procs.get(slot)
        return proc is not None and proc.alive()

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        if self.alive(spec.slot):
            raise LaunchError(f"slot {spec.slot} already runs a worker")
        host = self.config.host
        port = free_port(host)
        bootstrap = free_port(host) if spec.role is not LaunchRole.COLOCATED else None
        argv = engine_argv(self.engine, spec, host=host, port=port, bootstrap_port=bootstrap)
        env = {**self.engine.env, "CUDA_VISIBLE_DEVICES": visible_devices(spec.gpus)}
        log = Path(self.config.log_dir) / f"worker-{spec.slot}-{spec.role.value}-{port}.log"
        proc = ServerProcess(ServerSpec(name=f"slot{spec.slot}", argv=argv, port=port, log_path=log,
                                        env=env, host=host)).start()
        self._procs[spec.slot] = proc
        self.launches += 1
        try:
            await wait_healthy(self.session, proc.url, alive=proc.alive, timeout_s=self.engine.start_timeout_s,
                               describe=proc.log_tail)
        except BaseException:
            await self.stop(spec.slot)
            raise
        return LaunchedWorker(slot=spec.slot, endpoint=proc.url, bootstrap_port=bootstrap)

    async def stop(self, slot: int) -> None:
        proc = self._procs.pop(slot, None)
        if proc is not None:
            await asyncio.to_thread(proc.stop)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(slot) for slot in list(self._procs)))
