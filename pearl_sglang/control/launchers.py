"""Start and stop rollout worker processes for the control plane.

A launcher turns a ``LaunchSpec`` (slot, role, GPUs, weight version) into a running,
healthy worker and back. ``LocalLauncher`` runs processes on this host (GPUs through
``CUDA_VISIBLE_DEVICES``, free ports, one log per worker, stopped by process group);
``RayLauncher`` (``ray_launcher``) runs them as Ray actors on the node that holds the
GPUs; attach mode has no launcher at all (ratio changes only through ``/pd_role_switch``).
"""
from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import aiohttp

from pearl_sglang.control.cluster_config import EngineConfig, LauncherConfig
from pearl_sglang.control.processes import (STOP_GRACE_S, PortPool, ServerProcess, ServerSpec, group_alive,
                                           kill_group)
from pearl_sglang.control.start_failures import EngineCannotStart, LaunchError, PortInUse, start_failure
from pearl_sglang.core.state import Role
from pearl_sglang.engine.launch_args import EngineArgs, server_args

__all__ = ["EngineCannotStart", "LaunchError", "PortInUse", "LaunchSpec", "LaunchedWorker", "Launcher",
           "LocalLauncher", "engine_args", "engine_argv", "visible_devices", "wait_healthy"]


@dataclass(frozen=True)
class LaunchSpec:
    slot: int
    role: Role
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
                       describe, failed: Callable[[], LaunchError | None] = lambda: None) -> None:
    """Poll ``/health`` until it answers 200. ``failed`` reads the worker's output for a
    failed start (``start_failures``), so a worker that logged one does not cost the
    whole timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    polls = 0
    while True:
        if not alive():
            raise failed() or LaunchError(f"worker exited during start:\n{describe()}")
        polls += 1
        if polls % 10 == 0:  # reading the log every half second is plenty
            failure = failed()
            if failure is not None:
                raise failure
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            pass
        if loop.time() > deadline:
            raise LaunchError(f"worker not healthy after {timeout_s:.0f}s:\n{describe()}")
        await asyncio.sleep(0.05)  # the poll period is added to every preparation


class LocalLauncher:
    """Worker processes on this host. With ``outlive=True`` (a crash-safe control plane)
    they survive the router, which re-adopts them by PID after a restart."""

    def __init__(self, engine: EngineConfig, launcher: LauncherConfig, session: aiohttp.ClientSession,
                 *, outlive: bool = False) -> None:
        self.engine = engine
        self.config = launcher
        self.session = session
        self.outlive = outlive
        self._procs: dict[int, ServerProcess] = {}
        self._adopted: dict[int, int] = {}
        self._ports = PortPool()
        self._slot_ports: dict[int, tuple[int | None, ...]] = {}
        self.launches = 0
        self._on_change: Callable[[], None] = lambda: None

    def watch(self, on_change: Callable[[], None]) -> None:
        """Called as soon as a process starts or stops, so its PID reaches the crash-safe
        record before the worker is even healthy (a crash then cannot orphan it)."""
        self._on_change = on_change

    def slots(self) -> tuple[int, ...]:
        return tuple(sorted({*self._procs, *self._adopted}))

    def alive(self, slot: int) -> bool:
        proc = self._procs.get(slot)
        if proc is not None:
            return proc.alive()
        return slot in self._adopted and group_alive(self._adopted[slot])

    def pid(self, slot: int) -> int | None:
        proc = self._procs.get(slot)
        return proc.pid if proc is not None else self._adopted.get(slot)

    def adopt(self, slot: int, pid: int) -> None:
        """Take over a worker a previous control plane started (found alive on restart)."""
        self._adopted[slot] = pid

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        """Start the worker; a start that failed because its port was taken is retried on
        fresh ports (another process can bind a port between our choice and the worker's
        bind), other failures are raised at once."""
        for attempt in range(_PORT_ATTEMPTS):
            try:
                return await self._launch_once(spec)
            except PortInUse:
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
                logging.getLogger("pearl.control").warning(
                    "slot %s: its port was taken during start; starting it again on another port", spec.slot)
        raise AssertionError("unreachable")

    async def _launch_once(self, spec: LaunchSpec) -> LaunchedWorker:
        if self.alive(spec.slot):
            raise LaunchError(f"slot {spec.slot} already runs a worker")
        host = self.config.host
        port = self._ports.take(host)
        bootstrap = self._ports.take(host) if spec.role is not Role.COLOCATED else None
        self._slot_ports[spec.slot] = (port, bootstrap)
        argv = engine_argv(self.engine, spec, host=host, port=port, bootstrap_port=bootstrap)
        env = {**self.engine.env, "CUDA_VISIBLE_DEVICES": visible_devices(spec.gpus)}
        log = Path(self.config.log_dir) / f"worker-{spec.slot}-{spec.role.value}-{port}.log"
        since = log.stat().st_size if log.exists() else 0  # logs are appended to; read this start only
        proc = ServerProcess(ServerSpec(name=f"slot{spec.slot}", argv=argv, port=port, log_path=log,
                                        env=env, host=host, die_with_parent=not self.outlive)).start()
        self._procs[spec.slot] = proc
        self.launches += 1
        self._on_change()
        try:
            await wait_healthy(self.session, proc.url, alive=proc.alive, timeout_s=self.engine.start_timeout_s,
                               describe=proc.log_tail,
                               failed=lambda: start_failure(_read_from(log, since),
                                                            memory_saver=self.engine.memory_saver))
        except BaseException:
            # Nothing to drain: a worker that failed its start can hang in shutdown (SGLang
            # after a failed bind waits ~10 s for its application to stop), so no grace.
            await self.stop(spec.slot, grace_s=0.0)
            raise
        return LaunchedWorker(slot=spec.slot, endpoint=proc.url, bootstrap_port=bootstrap)

    async def stop(self, slot: int, grace_s: float = STOP_GRACE_S) -> None:
        self._ports.release(*self._slot_ports.pop(slot, ()))
        proc = self._procs.pop(slot, None)
        if proc is not None:
            await asyncio.to_thread(proc.stop, grace_s)
        pid = self._adopted.pop(slot, None)
        if pid is not None:
            await stop_group(pid, grace_s)
        self._on_change()

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(slot) for slot in self.slots()))


_PORT_ATTEMPTS = 3


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


async def stop_group(pid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM a process group, SIGKILL it if it is still there after ``grace_s``."""
    import signal

    if not kill_group(pid, signal.SIGTERM):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while group_alive(pid) and loop.time() < deadline:
        await asyncio.sleep(0.1)
    kill_group(pid, signal.SIGKILL)
