"""Emulated clusters under the real control plane (see benchmarks/harness/cluster.py)."""
from __future__ import annotations

import contextlib

from pearl_sglang.control.cluster_config import ClusterConfig
from benchmarks.harness import cluster as _cluster
from benchmarks.harness.cluster import TINY_PROFILE

TOKEN = "control-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

PROFILE = TINY_PROFILE


def cluster_config(model_dir, *, dedicated=2, overlap=2, pd_mode="colocated", time_scale=20,
                   gate=None, **extra) -> ClusterConfig:
    return ClusterConfig.from_mapping({
        "engine": {"kind": "emulator", "model_path": str(model_dir), "tp_size": 1,
                   "emulator": {"profile": "tiny", "time_scale": time_scale}},
        "zones": {"dedicated": [f"d0:{i}" for i in range(dedicated)],
                  "overlap": [f"t0:{i}" for i in range(overlap)]},
        "profile": PROFILE, "pd_mode": pd_mode,
        "gate": gate or {"enabled": False},
        "deadlines": {"train_begin_s": 30, "leave_s": 30, "drain_s": 5},
        **extra,
    })


@contextlib.asynccontextmanager
async def running_cluster(config: ClusterConfig, **kw):
    async with _cluster.running_cluster(config, token=TOKEN, **kw) as c:
        yield c
