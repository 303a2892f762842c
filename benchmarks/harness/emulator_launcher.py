"""A launcher that runs emulated workers inside the caller's event loop.

Same flags, same HTTP protocol and the same ``Launcher`` interface as the process
launcher, without a process per worker: scenario tests and benchmarks can then reshape
clusters of many workers hundreds of times on two cores. With ``in_process_pd``, a decode
reaches its prefill's KV through an in-process registry instead of the prefill's bootstrap
server: on a virtual-time loop, loopback traffic is real and a loaded host can deliver it
after a timer fires, so the KV handoff over HTTP made PD replays differ run to run.
"""
from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass, field

from pearl_sglang.control.cluster_config import EngineConfig
from pearl_sglang.control.launchers import LaunchedWorker, LaunchError, LaunchSpec, engine_args
from pearl_sglang.control.processes import PortPool
from pearl_sglang.emulator.config import parse_args
from pearl_sglang.emulator.pd import PDRegistry
from pearl_sglang.emulator.server import build_worker, start
from pearl_sglang.emulator.worker import Worker
from pearl_sglang.core.state import Role


_BIND_ATTEMPTS = 5


def phases(slot: int, worker: Worker) -> dict:
    """A worker's tokens and seconds by phase (``emulator.stats``), with its slot and TP size."""
    return {"slot": slot, "tp_size": worker.profile.tp_size, **worker.engine.stats.phases()}


@dataclass
class _Running:
    runners: list
    worker: Worker
    endpoint: str
    ports: tuple[int | None, ...] = ()


@dataclass
class InProcessEmulatorLauncher:
    engine: EngineConfig
    host: str = "127.0.0.1"
    in_process_pd: bool = False
    launches: int = 0
    # What each stopped worker did (``emulator.stats`` phases, by slot): a replay counts
    # the tokens of workers that left (preemption, reconfiguration) beside the running ones.
    retired: list[dict] = field(default_factory=list)
    _running: dict[int, _Running] = field(default_factory=dict)
    _by_endpoint: dict[str, Worker] = field(default_factory=dict)
    _ports: PortPool = field(default_factory=PortPool)
    _registry: PDRegistry = field(default_factory=PDRegistry)

    def slots(self) -> tuple[int, ...]:
        return tuple(sorted(self._running))

    def alive(self, slot: int) -> bool:
        return slot in self._running

    def worker(self, slot: int) -> Worker:
        """The emulated worker object (its engine), for tests that inspect it."""
        return self._running[slot].worker

    def worker_at(self, endpoint: str) -> Worker | None:
        """The running worker that serves ``endpoint`` (``benchmarks.harness.in_process_transport`` calls it)."""
        return self._by_endpoint.get(endpoint)

    async def launch(self, spec: LaunchSpec) -> LaunchedWorker:
        if self.engine.kind != "emulator":
            raise LaunchError("the in-process launcher runs emulated workers only")
        if spec.slot in self._running:
            raise LaunchError(f"slot {spec.slot} already runs a worker")
        for attempt in range(_BIND_ATTEMPTS):
            port = self._ports.take(self.host)
            bootstrap = self._ports.take(self.host) if spec.role is not Role.COLOCATED else None
            args, _ = parse_args(engine_args(self.engine, spec, host=self.host, port=port, bootstrap_port=bootstrap))
            worker = build_worker(args, rendezvous=self._registry if self.in_process_pd else None)
            cold = worker.profile.lifecycle.cold_start_s if args.cold_start is None else args.cold_start
            if attempt == 0 and cold > 0:  # as the process would: the port opens after the cold start
                await asyncio.sleep(worker.clock.real_delay(cold))
            try:
                runner, extra, bound, _ = await start(worker, host=self.host, port=port)
                break
            except OSError as e:
                self._ports.release(port, bootstrap)
                # A port that was free when chosen can be taken by another process meanwhile
                # (parallel benchmark runs); choose again rather than fail the launch.
                if e.errno != errno.EADDRINUSE or attempt == _BIND_ATTEMPTS - 1:
                    raise
            except BaseException:
                self._ports.release(port, bootstrap)
                raise
        endpoint = f"http://{self.host}:{bound}"
        self._running[spec.slot] = _Running([runner, *extra], worker, endpoint, (port, bootstrap))
        self._by_endpoint[endpoint] = worker
        self.launches += 1
        return LaunchedWorker(slot=spec.slot, endpoint=endpoint, bootstrap_port=bootstrap)

    async def stop(self, slot: int) -> None:
        running = self._running.pop(slot, None)
        if running is None:
            return
        self._by_endpoint.pop(running.endpoint, None)
        self.retired.append(phases(slot, running.worker))
        running.worker.close()
        if self.in_process_pd:  # its bootstrap address goes away with it, as its server does
            config = running.worker.engine.config
            self._registry.unbind(config.bootstrap_host, config.bootstrap_port, running.worker.engine)
        for runner in reversed(running.runners):
            await runner.cleanup()
        self._ports.release(*running.ports)

    async def stop_all(self) -> None:
        for slot in list(self._running):
            await self.stop(slot)
