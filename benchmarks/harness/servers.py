"""The harness's side of starting servers: wait for a set of them, and the real-SGLang CPU
stack that ``scripts/setup_sglang_cpu.sh`` builds (tests and benchmarks start SGLang from it)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from pearl_sglang.clock import WallClock
from pearl_sglang.control.processes import ServerProcess, ServerStartError


def wait_all_healthy(servers: Sequence[ServerProcess], timeout: float, *, clock: WallClock | None = None) -> None:
    """Poll every server until healthy; raise with the log of the first that failed. Runs
    outside the event loop (in a thread), so it waits by blocking on ``clock``."""
    clock = clock or WallClock()
    deadline = clock.now() + timeout
    pending = list(servers)
    while pending:
        for server in list(pending):
            if not server.alive():
                raise ServerStartError(f"{server.spec.name} exited during start:\n{server.log_tail()}")
            if server.healthy():
                pending.remove(server)
        if pending and clock.now() > deadline:
            names = ", ".join(s.spec.name for s in pending)
            raise ServerStartError(f"not healthy after {timeout:.0f}s: {names}\n{pending[0].log_tail()}")
        if pending:
            clock.block(0.5)


# SGLang treats its scheduler's SIGTERM (a stop signals the whole process group) as a
# crash: it sleeps 5 s "to let GPU activity settle" and dumps the schedulers with py-spy.
# With no GPU to settle, a stop takes 1 s instead of 5.
CPU_LANE_ENV = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}


@dataclass(frozen=True)
class SglangCpuStack:
    """The real-SGLang CPU stack made by scripts/setup_sglang_cpu.sh."""

    python: str
    env: Mapping[str, str]

    @classmethod
    def load(cls, root: Path) -> "SglangCpuStack":
        data = json.loads((root / "env.json").read_text())
        return cls(python=data["python"], env={**CPU_LANE_ENV, **data["env"]})

    def launch_argv(self, args: Sequence[str]) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", *args]
