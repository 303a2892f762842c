"""Session fixtures shared by every test folder: the tiny model and workers under test."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness.tiny_model import TinyModelSpec, write_tiny_model, write_weight_variant
from tests.support.workers import PdPair, Worker, WorkerLauncher, start_worker_set

WORKER_KINDS = ("sglang", "emulator")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), TinyModelSpec(arch="qwen2"))


@pytest.fixture(scope="session")
def tiny_model_variant_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The same model with other weights, for /update_weights_from_disk."""
    return write_weight_variant(tiny_model_dir, tmp_path_factory.mktemp("tiny-model-v2"), seed=7)


_worker_sets: dict[str, tuple[Worker, PdPair]] = {}


@pytest.fixture(scope="session")
def worker_sets(tiny_model_dir, tmp_path_factory):
    """Lazily started worker sets, one per kind, stopped by PID at session end."""
    launchers: dict[str, WorkerLauncher] = {}

    def get(kind: str) -> tuple[Worker, PdPair]:
        if kind not in _worker_sets:
            launcher = WorkerLauncher(kind, tmp_path_factory.mktemp(f"logs-{kind}"))
            launchers[kind] = launcher
            try:
                _worker_sets[kind] = start_worker_set(launcher, tiny_model_dir)
            except BaseException:
                launcher.stop_all()
                raise
        return _worker_sets[kind]

    yield get
    for launcher in launchers.values():
        launcher.stop_all()
    _worker_sets.clear()


@pytest.fixture(scope="session", params=WORKER_KINDS)
def worker_kind(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def worker(worker_sets, worker_kind) -> Worker:
    return worker_sets(worker_kind)[0]


@pytest.fixture(scope="session")
def pd_pair(worker_sets, worker_kind) -> PdPair:
    return worker_sets(worker_kind)[1]
