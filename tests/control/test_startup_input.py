"""Bad start-up input (cluster configuration files, command-line flags, the state
directory's record) is a one-line ``error: ...`` and exit status 2, never a traceback, a
hang or a router that serves without its control plane. Each case was found by fuzzing
the start-up surface."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pearl_sglang.control.cluster_config import ClusterConfig, ConfigError
from pearl_sglang.control.persistence import StateFile, UnreadableRecord
from pearl_sglang.control.processes import free_port
from tests.control.conftest import PROFILE


def _base(model_dir) -> dict:
    return {"engine": {"kind": "emulator", "model_path": str(model_dir), "tp_size": 1},
            "zones": {"dedicated": ["d0:0"]}, "profile": PROFILE}


@pytest.mark.parametrize("change,words", [
    ({"engine": [1, 2]}, "engine must be a mapping"),
    ({"engine": 5}, "engine must be a mapping"),
    ({"zones": 5}, "zones must be a mapping"),
    ({"zones": {"dedicated": None}}, "zones.dedicated must be a list"),
    ({"zones": {"dedicated": 0}}, "zones.dedicated must be a list"),
    ({"zones": {"dedicated": ["d0:0", "d0:0"]}}, "twice"),
    ({"engine": {"kind": "emulator", "tp_size": 2}, "zones": {"dedicated": ["d0:0", "d1:0"]}}, "on one node"),
    ({"engine": {"kind": "emulator", "extra_args": 5}}, "extra_args"),
    ({"engine": {"kind": "emulator", "weight_version": ["v"]}}, "weight_version"),
    ({"engine": {"kind": "emulator", "tp_size": 10 ** 20}}, "tp_size"),
    ({"engine": {"kind": "emulator", "start_timeout_s": float("nan")}}, "start_timeout_s"),
    ({"recovery": {"growth_backoff_s": 5}}, "growth_backoff_s"),
    ({"profile_fit": ["all"]}, "profile_fit"),
    ({"state_dir": 5}, "state_dir"),
    ({"time_scale": float("inf")}, "time_scale"),
    ({"gate": {"toggle_cost_s": -1}}, "toggle_cost_s"),
    ({"gate": {"toggle_cost_s": float("nan")}}, "toggle_cost_s"),
    ({"gate": {"alpha": 0}}, "alpha"),
    ({"gate": {"alpha": 1.5}}, "alpha"),
    ({"gate": {"enabled": "x"}}, "enabled"),
    ({"deadlines": {"drain_s": "x"}}, "drain_s"),
    ({"deadlines": {"drain_s": None}}, "drain_s"),
    ({"weights": {"group_init_timeout_s": float("nan")}}, "group_init_timeout_s"),
    ({"launcher": {"host": "no such host"}}, "launcher.host"),
    ({1: 2}, "unknown top-level"),
    ({"engine": {1: 2}}, "unknown key"),
])
def test_malformed_config_values_are_config_errors(tmp_path, change, words):
    data = {**_base(tmp_path), **change}
    if isinstance(change.get("engine"), dict) and "model_path" not in change["engine"]:
        data["engine"] = {**_base(tmp_path)["engine"], **change["engine"]}
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        ClusterConfig.from_mapping(data)


@pytest.mark.parametrize("name,content,words", [
    ("x.yaml", "engine: [unclosed", "not valid YAML"),
    ("x.yaml", "? [a, b]\n: 1\n", "not valid YAML"),
    ("x.yaml", "a: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("x.json", "[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ("x.json", "{", "not valid JSON"),
    ("x.json", b"\xff\xfe\x00garbage", "not valid JSON"),
])
def test_unparsable_config_files_are_config_errors(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=words):
        ClusterConfig.load(path)


def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it():
    with pytest.raises(ConfigError, match="not a regular file"):
        ClusterConfig.load("/dev/zero")  # read whole, it never ends


@pytest.mark.parametrize("content", [
    b"", b"{", b"\xff\x00", b"[1, 2]", b"null", b'"x"', b"{}", b'{"format": 2}', b'{"format": "1"}',
    b'{"format": 1, "table": [], "snapshot": {}, "last_step": {}, "workers": {}, "training": false, '
    b'"borrowing": false}',
    b'{"format": 1, "table": {"tp_size": "x"}, "snapshot": {"version": "v"}, "last_step": {}, "workers": {}, '
    b'"training": false, "borrowing": false}',
])
def test_an_unreadable_state_record_is_refused_with_its_reason(tmp_path, content):
    (tmp_path / "state.json").write_bytes(content)
    state = StateFile(tmp_path)
    try:
        with pytest.raises(UnreadableRecord, match="cannot be read back"):
            state.load()
    finally:
        state.close()


def _router(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pearl_sglang.router", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def test_bad_flags_and_an_address_in_use_are_one_line_errors(tmp_path):
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        cases = [
            (["--port", str(port)], "address already in use"),
            (["--host", "no.such.host.invalid"], "cannot listen on no.such.host.invalid"),
            (["--log-level", "foo"], "--log-level: invalid choice"),
            (["--tp-size", "0"], "--tp-size must be in [1, 1024]"),
            (["--tp-size", "99999999999999999999", "--worker-urls", "http://127.0.0.1:1"], "--tp-size"),
            (["--health-interval-s", "nan"], "must be a finite number"),
            (["--shutdown-grace-s", "inf"], "must be a finite number"),
        ]
        for args, words in cases:
            done = _router("--port", str(free_port()), *args)
            assert done.returncode == 2, (args, done.stderr[-2000:])
            assert words in done.stderr and "Traceback" not in done.stderr, (args, done.stderr[-2000:])
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(10)


def test_a_router_with_an_unreadable_state_record_does_not_start_and_keeps_the_record(tmp_path, tiny_model_dir):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text('{"format": 1, "table": {')  # cut short by a crash
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({**_base(tiny_model_dir), "state_dir": str(state_dir)}))
    done = _router("--config", str(config), "--port", str(free_port()))
    assert done.returncode == 2 and "cannot be read back" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert (state_dir / "state.json").read_text() == '{"format": 1, "table": {'


@pytest.mark.parametrize("host,words", [("no.such.host.invalid", "cannot resolve host"),
                                        ("8.8.8.8", "not an address of this machine")])
def test_a_launcher_host_that_is_not_this_machine_stops_the_start(tmp_path, tiny_model_dir, host, words):
    # It once blocked the event loop for every port tried (a lookup per bind): the router
    # never answered, not even /health.
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({**_base(tiny_model_dir), "launcher": {"host": host}}))
    started = time.monotonic()
    done = _router("--config", str(config), "--port", str(free_port()))
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("attached,words", [
    ({"regular": ("http://[::1",)}, "malformed"),
    ({"regular": ("http://127.0.0.1:99999",)}, "malformed"),
    ({"regular": ("http://127.0.0.1:abc",)}, "malformed"),
    ({"regular": ("http://",)}, "no host"),
    ({"regular": ("http://a b:1",)}, "no host"),
    ({"regular": ("ftp://x",)}, "http://"),
    ({"prefill": (("http://127.0.0.1:1", 0),), "decode": ("http://127.0.0.1:2",)}, "bootstrap port"),
    ({"prefill": (("http://127.0.0.1:1", 99999),), "decode": ("http://127.0.0.1:2",)}, "bootstrap port"),
])
def test_attached_worker_urls_are_checked_like_registered_ones(attached, words):
    # They once became workers that were forever down; the worker API refused the same URLs.
    from pearl_sglang.router.config import AttachedWorkers

    with pytest.raises(ValueError, match=words):
        AttachedWorkers(**attached).validate()


def test_a_non_ascii_bootstrap_port_flag_is_named():
    done = _router("--prefill", "http://127.0.0.1:1", "\u00b2", "--decode", "http://127.0.0.1:2",
                   "--port", str(free_port()))
    assert done.returncode == 2 and "--prefill bootstrap port must be a number" in done.stderr, done.stderr[-2000:]
