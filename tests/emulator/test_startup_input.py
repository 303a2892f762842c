"""The emulated worker's command line and profile files: bad values are one-line errors
(exit 2) before it serves. Found by fuzzing: a NaN time scale or cost left the worker
spinning at 100% CPU, deaf to SIGTERM, with every request hanging; profile fields of the
wrong type crashed with tracebacks or broke every request later."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pearl_sglang.emulator.__main__ import main
from pearl_sglang.emulator.profile import PROFILE_DIR, ProfileError, load_profile


@pytest.mark.parametrize("flags", [
    ["--time-scale", "nan"], ["--time-scale", "inf"], ["--pd-timeout", "nan"], ["--health-timeout", "-1"],
    ["--cold-start", "inf"], ["--cold-start", "nan"], ["--cold-start", "-5"], ["--tp-size", "0"], ["--dp-size", "0"],
    ["--port", "70000"], ["--port", "-1"],
    ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "-1"],
    ["--host", "999.1.1.1", "--port", "0"],
])
def test_a_bad_flag_is_a_one_line_error(flags, capsys):
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def test_an_address_in_use_is_a_one_line_error(capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert main(["--host", "127.0.0.1", "--port", str(held.getsockname()[1]), "--cold-start", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot listen")


def test_a_nan_time_scale_exits_at_once_instead_of_spinning():
    proc = subprocess.run([sys.executable, "-m", "pearl_sglang.emulator", "--port", "0", "--time-scale", "nan"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--time-scale" in proc.stderr and "Traceback" not in proc.stderr


def _tiny() -> dict:
    return json.loads((PROFILE_DIR / "tiny.json").read_text())


@pytest.mark.parametrize("change", [
    {"vocab_size": "1024"}, {"vocab_size": None}, {"max_total_tokens": 100.5}, {"max_running_requests": True},
    {"name": 5}, {"tp_size": 0}, {"context_length": 0}, {"new_token_ratio": float("nan")},
    {"kv_bandwidth_bytes_per_s": float("inf")}, {"cost": {"decode_fixed_s": "0.002"}},
    {"cost": {"decode_fixed_s": float("nan")}}, {"cost": {"prefill_per_token_s": -1e-6}},
    {"lifecycle": {"cold_start_s": "0"}}, {"cost": [1, 2]},
])
def test_a_profile_field_of_the_wrong_type_or_range_is_a_profile_error(tmp_path: Path, change):
    data = _tiny()
    for key, value in change.items():
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as JSON's extensions, as Python writes them
    with pytest.raises(ProfileError):
        load_profile(str(path))


@pytest.mark.parametrize("text", ["[1, 2, 3]", "null", '"tiny"'])
def test_a_profile_that_is_not_an_object_is_a_profile_error(tmp_path: Path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match="malformed profile"):
        load_profile(str(path))


def test_every_bundled_profile_passes_the_checks():
    for path in PROFILE_DIR.glob("*.json"):
        load_profile(str(path))
