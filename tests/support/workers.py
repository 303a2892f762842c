"""Workers under test: the same SGLang protocol from real SGLang (CPU) or the emulator.

A conformance test receives a ``Worker`` or a ``PdPair`` and never knows which kind it
got; the kind decides only how the server process is started.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from pearl_sglang.core.state import Role
from pearl_sglang.engine.launch_args import EngineArgs, server_args
from benchmarks.harness.servers import SglangCpuStack, wait_all_healthy
from pearl_sglang.control.processes import ServerProcess, ServerSpec, free_port

REPO = Path(__file__).resolve().parents[2]
STACK_DIR = REPO / ".sglang-cpu"
START_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Worker:
    kind: str
    url: str
    model_dir: Path


@dataclass(frozen=True)
class PdPair:
    kind: str
    prefill_url: str
    decode_url: str
    prefill_bootstrap_port: int
    decode_bootstrap_port: int
    model_dir: Path


def engine_args(model_dir: Path) -> EngineArgs:
    """CPU-lane settings: float32 for token-exact resumption, sleep-on-idle so several
    servers share two cores, no overlap schedule (it creates a CUDA event)."""
    return EngineArgs(
        model_path=str(model_dir), device="cpu", dtype="float32", max_total_tokens=16384,
        sleep_on_idle=True, disable_overlap_schedule=True, decode_retraction_backup="cpu_tensor",
        role_switchable=True)


class WorkerLauncher:
    """Starts servers of one kind; keeps them so a session finalizer can stop them all."""

    def __init__(self, kind: str, log_dir: Path) -> None:
        self.kind = kind
        self.log_dir = log_dir
        self.servers: list[ServerProcess] = []
        self._stack = SglangCpuStack.load(STACK_DIR) if kind == "sglang" else None

    def _argv(self, args: list[str]) -> list[str]:
        if self._stack is not None:
            return self._stack.launch_argv(args)
        return [sys.executable, "-m", "pearl_sglang.emulator", *args, "--profile", "tiny"]

    def _env(self) -> dict[str, str]:
        return dict(self._stack.env) if self._stack is not None else {}

    def start(self, name: str, model_dir: Path, role: Role,
              bootstrap_port: int | None = None, extra: tuple[str, ...] = ()) -> ServerProcess:
        port = free_port()
        engine = replace(engine_args(model_dir), extra=extra) if extra else engine_args(model_dir)
        args = server_args(engine, role=role, host="127.0.0.1", port=port,
                           bootstrap_port=bootstrap_port)
        spec = ServerSpec(name=f"{self.kind}-{name}", argv=self._argv(args), port=port,
                          log_path=self.log_dir / f"{self.kind}-{name}.log", env=self._env())
        server = ServerProcess(spec).start()
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()


def start_worker_set(launcher: WorkerLauncher, model_dir: Path) -> tuple[Worker, PdPair]:
    """One colocated worker and one switchable prefill/decode pair, started together."""
    pb, db = free_port(), free_port()
    colocated = launcher.start("colocated", model_dir, Role.COLOCATED)
    prefill = launcher.start("prefill", model_dir, Role.PREFILL, bootstrap_port=pb)
    decode = launcher.start("decode", model_dir, Role.DECODE, bootstrap_port=db)
    wait_all_healthy([colocated, prefill, decode], timeout=START_TIMEOUT_S)
    worker = Worker(kind=launcher.kind, url=colocated.url, model_dir=model_dir)
    pair = PdPair(kind=launcher.kind, prefill_url=prefill.url, decode_url=decode.url,
                  prefill_bootstrap_port=pb, decode_bootstrap_port=db, model_dir=model_dir)
    return worker, pair
