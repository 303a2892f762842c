"""Run rollout workers as Ray actors on the node that holds their GPUs (multi-node clusters).

The control plane's GPU ids are ``node:index``; the table, not Ray, decides which GPUs a
worker gets. Ray only has to put the worker on the right machine: every node advertises a
custom resource ``pearl_node:<node>`` (``ray start --resources='{"pearl_node:node0": 8}'``)
and a worker's actor asks for one unit of it per GPU, so it lands where its GPUs are. The
actor starts the worker process there (own process group, log file on that node, ports of
that node reserved against its other actors, ``CUDA_VISIBLE_DEVICES`` from the indices)
and reports the endpoint; the controller waits for ``/health`` over HTTP as with local
processes. Actors are owned by the controller's Ray driver, so workers go away with the
controller: stopping a worker ends its process group, then kills the actor, and the
process's parent-death signal follows the actor.

Ray is imported here only; the composition root (``server.compose``) imports this module
when ``launcher.kind == "ray"``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import ray
from ray.exceptions import RayError

from pearl_sglang.control.cluster_config import EngineConfig, LauncherConfig
from pearl_sglang.control.launchers import (LaunchedWorker, LaunchError, LaunchSpec, engine_argv, visible_devices,
                                            wait_healthy)
from pearl_sglang.control.processes import ServerProcess, ServerSpec, free_port
from pearl_sglang.core.state import Role

NODE_RESOURCE = "pearl_node:{node}"
_STOP_TIMEOUT_S = 30.0
_CALL_TIMEOUT_S = 10.0


def _holder_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reserve_ports(host: str, count: int) -> list[int]:
    """Free ports of this node that no other worker actor on it holds. A port is picked
    seconds (for SGLang's HTTP port, minutes) before the worker binds it, and actors pick
    concurrently; a reservation lasts as long as the actor that made it."""
    table = Path(tempfile.gettempdir()) / "pearl-ray-ports.json"
    with open(table.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            held = {int(p): pid for p, pid in json.loads(table.read_text()).items() if _holder_alive(pid)}
        except (OSError, ValueError):
            held = {}
        ports: list[int] = []
        while len(ports) < count:
            port = free_port(host)
            if port not in held and port not in ports:
                ports.append(port)
        held.update({port: os.getpid() for port in ports})
        table.write_text(json.dumps(held))
    return ports


@dataclass(frozen=True)
class _Started:
    host: str
    port: int
    bootstrap_port: int | None
    pid: int | None
    log_path: str


class WorkerActor:
    """One worker process on its node. An asyncio actor: its event loop thread lives as long
    as the actor, so the process's parent-death signal fires when the actor dies."""

    def __init__(self) -> None:
        self._proc: ServerProcess | None = None

    async def start(self, engine: EngineConfig, spec: LaunchSpec, log_dir: str) -> _Started:
        if self._proc is not None:
            raise LaunchError(f"slot {spec.slot}: this actor already started a worker")
        host = ray.util.get_node_ip_address()
        port, *rest = reserve_ports(host, 1 if spec.role is Role.COLOCATED else 2)
        bootstrap = rest[0] if rest else None
        # Build the command line here: the node's own interpreter, unless the config names one.
        argv = engine_argv(engine, spec, host=host, port=port, bootstrap_port=bootstrap)
        env = {**engine.env, "CUDA_VISIBLE_DEVICES": visible_devices(spec.gpus)}
        log = Path(log_dir) / f"worker-{spec.slot}-{spec.role.value}-{port}.log"
        self._proc = ServerProcess(ServerSpec(name=f"slot{spec.slot}", argv=argv, port=port, log_path=log,
                                              env=env, host=host)).start()
        return _Started(host=host, port=port, bootstrap_port=bootstrap, pid=self._proc.pid, log_path=str(log))

    async def wait_exit(self) -> None:
        """Returns when the process has exited; the controller watches this call's result."""
        while self._proc is not None and self._proc.alive():
            await asyncio.sleep(0.5)

    async def log_tail(self) -> str:
        return self._proc.log_tail() if self._proc is not None else "(not started)"

    async def stop(self) -> None:
        if self._proc is not None:
            await asyncio.to_thread(self._proc.stop)


_RemoteWorker = ray.remote(WorkerActor)


@dataclass
class _Handle:
    actor: Any  # ray.actor.ActorHandle
    name: str
    exited: concurrent.futures.Future


class RayLauncher:
    """The ``Launcher`` of multi-node clusters: one Ray actor per slot.

    ``num_gpus`` is what each actor reserves from Ray's GPU accounting: by default the TP size
    for SGLang and 0 for emulated workers. It is a count only: the devices are the table's
    (``CUDA_VISIBLE_DEVICES`` overrides Ray's choice). Give 0 where rollout shares GPUs with
    training actors that already hold them in Ray (the overlap zone), or it is never placed.
    """

    def __init__(self, engine: EngineConfig, launcher: LauncherConfig, session: aiohttp.ClientSession, *,
                 num_gpus: float | None = None, namespace: str | None = None) -> None:
        self.engine = engine
        self.config = launcher
        self.session = session
        self.num_gpus = (engine.tp_size if engine.kind == "sglang" else 0) if num_gpus is None else num_gpus
        self.namespace = namespace
        self.log_dir = str(Path(launcher.log_dir).absolute())
        self.launches = 0
        self._handles: dict[int, _Handle] = {}
        self._connect_lock = asyncio.Lock()

    def slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._handles))

    def alive(self, slot: int) -> bool:
        handle = self._handles.get(slot)
        return handle is not None and not handle.exited.done()

    def actor_name(self, slot: int) -> str | None:
        handle = self._handles.get(slot)
        return handle.name if handle is not None else None

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        if self.alive(spec.slot):
            raise LaunchError(f"slot {spec.slot} already runs a worker")
        await self.stop(spec.slot)  # a worker that exited on its own still holds its actor
        visible_devices(spec.gpus)  # one node per worker
        node = spec.gpus[0].split(":", 1)[0]
        resource = NODE_RESOURCE.format(node=node)
        await self._connect()
        offered = await asyncio.to_thread(ray.cluster_resources)
        if offered.get(resource, 0) < len(spec.gpus):
            raise LaunchError(f"no Ray node offers {len(spec.gpus)} x {resource!r} for GPUs {list(spec.gpus)}; "
                              f"start the node with --resources='{{\"{resource}\": <GPUs>}}'")
        self.launches += 1
        name = f"pearl-worker-{spec.slot}-{self.launches}"
        actor = _RemoteWorker.options(name=name, num_cpus=0, num_gpus=self.num_gpus, max_restarts=0,
                                      resources={resource: len(spec.gpus)}).remote()
        try:
            started: _Started = await asyncio.wait_for(
                actor.start.remote(self.engine, spec, self.log_dir), self.engine.start_timeout_s)
        except BaseException as e:
            ray.kill(actor, no_restart=True)
            if isinstance(e, (RayError, asyncio.TimeoutError)):
                raise LaunchError(f"slot {spec.slot}: worker actor on {node} did not start: {e}") from e
            raise
        handle = _Handle(actor=actor, name=name, exited=actor.wait_exit.remote().future())
        self._handles[spec.slot] = handle
        url = f"http://{started.host}:{started.port}"
        where = f"slot {spec.slot} on {node} ({started.host}), pid {started.pid}, log {started.log_path}"
        try:
            await wait_healthy(self.session, url, alive=lambda: not handle.exited.done(),
                               timeout_s=self.engine.start_timeout_s, describe=lambda: where)
        except LaunchError as e:
            tail = await self._log_tail(handle)
            await self.stop(spec.slot)
            raise LaunchError(f"{e}\n{tail}") from e
        except BaseException:
            await self.stop(spec.slot)
            raise
        return LaunchedWorker(slot=spec.slot, endpoint=url, bootstrap_port=started.bootstrap_port)

    async def stop(self, slot: int) -> None:
        handle = self._handles.pop(slot, None)
        if handle is None:
            return
        try:
            await asyncio.wait_for(handle.actor.stop.remote(), _STOP_TIMEOUT_S)
        except (RayError, asyncio.TimeoutError):
            pass  # the actor is gone or stuck: killing it below takes the process with it
        finally:
            ray.kill(handle.actor, no_restart=True)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(slot) for slot in list(self._handles)))

    async def _log_tail(self, handle: _Handle) -> str:
        try:
            return await asyncio.wait_for(handle.actor.log_tail.remote(), _CALL_TIMEOUT_S)
        except (RayError, asyncio.TimeoutError) as e:
            return f"(log unavailable: {e!r})"

    async def _connect(self) -> None:
        """Join the running Ray cluster (``launcher.ray_address``) unless this process already has."""
        async with self._connect_lock:
            if not ray.is_initialized():
                await asyncio.to_thread(ray.init, address=self.config.ray_address, namespace=self.namespace,
                                        log_to_driver=False)
