"""A router SIGKILLed at any moment and restarted from its state dir reaches a consistent
table, keeps (adopts) the workers that are fine, rolls back half-done admissions, and
serves; nothing is left running after an orderly stop."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from pearl_sglang.control.processes import ServerProcess, ServerSpec, free_port, group_alive
from benchmarks.harness.tiny_model import write_tiny_model
from tests.control.conftest import PROFILE

pytestmark = pytest.mark.timeout(240)
TOKEN = "crash-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def write_config(tmp_path, model_dir, cold_start_s):
    config = {
        "engine": {"kind": "emulator", "model_path": str(model_dir), "tp_size": 1,
                   "emulator": {"profile": "tiny", "time_scale": 20, "cold_start": cold_start_s}},
        "launcher": {"kind": "local", "log_dir": str(tmp_path / "logs")},
        "zones": {"dedicated": ["d0:0", "d0:1"], "overlap": ["t0:0", "t0:1"]},
        "profile": PROFILE, "pd_mode": "colocated", "gate": {"enabled": False},
        "state_dir": str(tmp_path / "state"), "time_scale": 20,
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(config))
    return path


def start_router(tmp_path, config_path, name):
    port = free_port()
    argv = [sys.executable, "-m", "pearl_sglang.router", "--policy", "pearl", "--config", str(config_path),
            "--port", str(port), "--log-level", "WARNING"]
    router = ServerProcess(ServerSpec(name=name, argv=argv, port=port, log_path=tmp_path / f"{name}.log",
                                      env={"PEARL_ADMIN_TOKEN": TOKEN}, health_path="/readiness")).start()
    deadline = time.monotonic() + 60
    while not router.healthy():
        assert router.alive(), router.log_tail()
        assert time.monotonic() < deadline, router.log_tail()
        time.sleep(0.1)
    return router


def state(router):
    return httpx.get(router.url + "/pearl/state", headers=AUTH, timeout=10).json()


def settled(router, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = state(router)["table"]
        moving = [w for w in table["workers"] if w["activity"] in ("joining", "leaving")]
        if not moving:
            return table
        time.sleep(0.2)
    raise AssertionError(f"not settled: {table}")


def generate(router):
    r = httpx.post(router.url + "/generate", timeout=60, json={
        "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def worker_pids(tmp_path):
    record = json.loads((tmp_path / "state" / "state.json").read_text())
    return {slot: w["pid"] for slot, w in record["workers"].items() if w["pid"]}


def leftovers(model_dir):
    out = subprocess.run(["pgrep", "-f", f"pearl_sglang.emulator.*{model_dir}"], capture_output=True, text=True)
    return out.stdout.split()


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A model folder of this test's own, so the leftover check matches only its workers
    (the session's emulated conformance servers use the shared one)."""
    return write_tiny_model(tmp_path / "own-model")


def test_restart_after_sigkill_while_idle_adopts_workers(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, cold_start_s=0)
    router = start_router(tmp_path, config, "router-1")
    try:
        settled(router)
        before = worker_pids(tmp_path)
        assert len(before) == 2
        router.kill()
        assert all(group_alive(pid) for pid in before.values())  # workers outlive the router
        router = start_router(tmp_path, config, "router-2")
        table = settled(router)
        assert worker_pids(tmp_path) == before  # adopted, not relaunched
        assert [w["activity"] for w in table["workers"] if w["role"] != "training"] == ["active", "active"]
        assert generate(router)["meta_info"]["completion_tokens"] == 8
    finally:
        router.stop()
    assert not leftovers(tiny_model_dir)
    assert not (tmp_path / "state" / "state.json").exists()


def test_sigkill_during_train_finished_activation_recovers(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, cold_start_s=40)  # 2 s real per new worker
    router = start_router(tmp_path, config, "router-1")
    try:
        settled(router)
        assert httpx.post(router.url + "/train_begin", json={"step": 0}, headers=AUTH, timeout=30).status_code == 200
        r = httpx.post(router.url + "/train_finished", json={"step": 0}, headers=AUTH, timeout=30)
        assert r.json()["borrowing"]
        time.sleep(0.5)  # overlap workers are starting: the activation is in flight
        recorded = json.loads((tmp_path / "state" / "state.json").read_text())
        assert recorded["intent"] is not None
        assert any(w["activity"] == "joining" for w in recorded["table"]["workers"])
        router.kill()
        router = start_router(tmp_path, config, "router-2")
        recovered = state(router)["control"]["recovery"]
        assert recovered["intent"]["operation"] == "intra_scale"
        table = settled(router)
        rollout = [w for w in table["workers"] if w["role"] != "training"]
        assert all(w["activity"] == "active" for w in rollout), rollout
        assert sum(w["zone"] == "overlap" for w in rollout) == 2  # borrowing redone after the rollback
        assert table["overlap_owner"] == "rollout"
        assert generate(router)["meta_info"]["completion_tokens"] == 8
        # Every live worker process is one the table knows; none was orphaned.
        pids = worker_pids(tmp_path)
        assert len(pids) == 4 and len(leftovers(tiny_model_dir)) >= 4
        # The trainer's retried call for step 0 is answered, not refused.
        again = httpx.post(router.url + "/train_finished", json={"step": 0}, headers=AUTH, timeout=30)
        assert again.status_code == 200 and again.json()["repeated_step"]
        out = httpx.post(router.url + "/train_begin", json={"step": 1}, headers=AUTH, timeout=60).json()
        assert out["returned_gpus"] == ["t0:0", "t0:1"]
        assert state(router)["table"]["overlap_owner"] == "training"
    finally:
        router.stop()
    time.sleep(0.5)
    assert not leftovers(tiny_model_dir)


def test_restart_takes_weight_versions_from_the_workers(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, cold_start_s=0)
    router = start_router(tmp_path, config, "router-1")
    try:
        table = settled(router)
        worker = next(w for w in table["workers"] if w["role"] != "training")
        router.kill()
        # A push that reached the worker after the record was written.
        httpx.post(worker["endpoint"] + "/update_weight_version",
                   json={"new_version": "v-late", "abort_all_requests": False}, timeout=10)
        router = start_router(tmp_path, config, "router-2")
        table = settled(router)
        versions = {w["slot"]: w["weight_version"] for w in table["workers"]}
        assert versions[worker["slot"]] == "v-late"
        assert any("v-late" in note for note in state(router)["control"]["recovery"]["notes"])
    finally:
        router.stop()
    assert not leftovers(tiny_model_dir)


def test_a_second_router_on_the_same_state_dir_refuses_to_start(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, cold_start_s=0)
    router = start_router(tmp_path, config, "router-1")
    try:
        settled(router)
        before = worker_pids(tmp_path)
        second = subprocess.run([sys.executable, "-m", "pearl_sglang.router", "--policy", "pearl", "--config",
                                 str(config), "--port", str(free_port())], capture_output=True, text=True,
                                timeout=60, env={**__import__("os").environ, "PEARL_ADMIN_TOKEN": TOKEN})
        assert second.returncode == 2, second.stderr
        assert "in use by another router" in second.stderr and str(router.pid) in second.stderr, second.stderr
        assert worker_pids(tmp_path) == before and all(group_alive(p) for p in before.values())
        assert generate(router)["meta_info"]["completion_tokens"] == 8
    finally:
        router.stop()
    assert not leftovers(tiny_model_dir)


def test_the_state_dir_lock_is_exclusive_and_freed_on_close(tmp_path):
    from pearl_sglang.control.persistence import StateDirInUse, StateFile

    first = StateFile(tmp_path / "state")
    with pytest.raises(StateDirInUse, match="in use by another router"):
        StateFile(tmp_path / "state")
    first.close()
    StateFile(tmp_path / "state").close()


def test_the_push_count_survives_a_restart(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, cold_start_s=0)
    router = start_router(tmp_path, config, "router-1")
    try:
        settled(router)
        for version in ("v1", "v2"):
            r = httpx.post(router.url + "/update_weights", headers=AUTH, timeout=60,
                           json={"version": version, "model_path": str(tiny_model_dir)})
            assert r.status_code == 200 and r.json()["push"] == int(version[1:]), r.text
        router.kill()
        router = start_router(tmp_path, config, "router-2")
        settled(router)
        pushes = state(router)["control"]["pushes"]
        assert pushes["number"] == 2 and pushes["servable_versions"] == ["v2"], pushes
        r = httpx.post(router.url + "/update_weights", headers=AUTH, timeout=60,
                       json={"version": "v3", "model_path": str(tiny_model_dir)})
        assert r.json()["push"] == 3
    finally:
        router.stop()
    assert not leftovers(tiny_model_dir)


def test_an_operators_pd_mode_outlives_a_restart(tmp_path, tiny_model_dir):
    # Found by fuzzing: after a SIGKILL and a restart the router went back to the config's
    # mode, undoing the operator's /pearl/pd_mode.
    config = write_config(tmp_path, tiny_model_dir, cold_start_s=0)
    router = start_router(tmp_path, config, "router-1")
    try:
        settled(router)
        r = httpx.post(router.url + "/pearl/pd_mode", json={"pd_mode": "disaggregated"}, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        router.kill()
        router = start_router(tmp_path, config, "router-2")
        table = settled(router)
        assert state(router)["control"]["pd_mode"] == "disaggregated"
        assert sorted(w["role"] for w in table["workers"] if w["role"] != "training") == ["decode", "prefill"]
        assert generate(router)["meta_info"]["completion_tokens"] == 8
    finally:
        router.stop()
    assert not leftovers(tiny_model_dir)
