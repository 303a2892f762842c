"""The demo's real processes: PEARL's router (which launches the emulated workers)."""
from __future__ import annotations

import asyncio
import json
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from pearl_sglang.control.processes import ServerProcess, ServerSpec, free_port
from pearl_sglang.core.presets import qwen3_8b_tp2
from pearl_sglang.demo.config import DemoConfig


class StackFailed(RuntimeError):
    """The router or its cluster did not come up; the message carries the router's log tail."""


@dataclass(frozen=True)
class Stack:
    router: ServerProcess
    url: str
    token: str
    model_dir: Path


def write_cluster(config: DemoConfig, run: Path) -> tuple[Path, Path]:
    """The emulated model folder and the cluster configuration the router loads."""
    model = run / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936}))
    profile = qwen3_8b_tp2(B=config.batch_size)
    cluster = {
        "engine": {"kind": "emulator", "model_path": str(model), "tp_size": 2, "weight_version": "step-init",
                   "emulator": {"profile": config.worker_profile, "time_scale": config.time_scale,
                                "seed": config.seed}},
        "launcher": {"kind": "local", "log_dir": str(run / "logs")},
        "zones": {"dedicated": [f"reserved0:{i}" for i in range(2 * config.dedicated_workers)],
                  "overlap": [f"train{i // 8}:{i % 8}" for i in range(2 * config.overlap_workers)]},
        "profile": profile.__dict__,
        "gate": {"toggle_cost_s": 6.26 + 3.18},
        "deadlines": {"train_begin_s": 60, "leave_s": 30, "drain_s": 15},
        "time_scale": config.time_scale,
    }
    path = run / "cluster.json"
    path.write_text(json.dumps(cluster, indent=1))
    return model, path


async def start(config: DemoConfig, run: Path) -> Stack:
    model, cluster = write_cluster(config, run)
    token = secrets.token_hex(16)
    port = config.port or free_port()
    policy = "pearl" if config.system == "pearl" else "static"
    argv = [sys.executable, "-m", "pearl_sglang.router", "--policy", policy, "--config", str(cluster),
            "--port", str(port), "--log-level", "WARNING"]
    router = ServerProcess(ServerSpec(name="router", argv=argv, port=port, log_path=run / "logs" / "router.log",
                                      env={"PEARL_ADMIN_TOKEN": token}, health_path="/readiness")).start()
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(1200):
            if not router.alive():
                raise StackFailed(f"the router exited:\n{router.log_tail()}")
            try:
                async with session.get(url + "/readiness") as r:
                    if r.status == 200:
                        return Stack(router=router, url=url, token=token, model_dir=model)
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    router.stop()
    raise StackFailed(f"the cluster did not become ready:\n{router.log_tail()}")
