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
