"""The demo's configuration: the calibrated regime by default, the other selectable."""
from __future__ import annotations

import argparse

import pytest

from pearl_sglang.demo.config import DemoConfig


def _parse(*argv: str) -> DemoConfig:
    parser = argparse.ArgumentParser()
    DemoConfig.add_cli_args(parser)
    return DemoConfig.from_cli_args(parser.parse_args(list(argv)))


def test_demo_runs_the_calibrated_preset_unless_told_otherwise():
    config = _parse()
    assert config.preset == "swe-paper" and config.worker_profile == "qwen3-8b-h800-tp2-swe-paper"
    assert config.train_step_s == pytest.approx(163.8 * 8 / 16)  # the paper's 8-GPU step on 16 GPUs
    assert _parse("--preset", "env-bound").worker_profile == "qwen3-8b-h800-tp2"
    assert _parse("--profile", "tiny").worker_profile == "tiny"
    with pytest.raises(SystemExit):
        _parse("--preset", "nope")


def test_partial_rollout_carry_over_is_off_unless_asked_for():
    assert _parse().carry_over_share == 0.0
    assert _parse("--carry-over-share", "0.9").carry_over_share == 0.9
    with pytest.raises(ValueError, match="carry-over-share"):
        _parse("--carry-over-share", "1.5")


@pytest.mark.parametrize("argv", [
    ("--minutes", "nan"), ("--time-scale", "nan"), ("--time-scale", "inf"), ("--train-step-s", "nan"),
    ("--trace-start-h", "nan"), ("--trace-start-h", "-5"), ("--max-preemptible-workers", "-1"),
    ("--overlap-workers", "-1"), ("--port", "-1"), ("--port", "70000"), ("--profile", "nosuch"),
])
def test_values_no_demo_can_run_on_are_refused_before_it_starts(argv):
    # Found by fuzzing: --minutes nan ran one step and reported success; --profile nosuch
    # waited two minutes for workers that could not start; a bad port or time scale ended
    # in the router's error as a traceback.
    with pytest.raises(ValueError):
        _parse(*argv)


@pytest.mark.parametrize("argv,message", [
    (("--trace-start-h", "1e9"), "trace-start-h"), (("--out", "/proc/no-such-dir/x"), "--out"),
])
def test_the_demo_program_refuses_a_trace_start_past_the_trace_and_an_unwritable_out(argv, message, capsys):
    from pearl_sglang.demo.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2 and message in capsys.readouterr().err
