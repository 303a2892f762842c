"""The harness runs the preset's regime: the replay CLI, the trainer's step time and the
decision engine's starting profile follow it."""
from __future__ import annotations

import pytest

from benchmarks.harness import replay, systems
from pearl_sglang.workload.presets import load_preset


def test_replay_cli_defaults_to_the_presets_rewrite_share():
    """The CLI used to default to 0.0 while every experiment ran 0.9."""
    config = replay.config_from_args(replay.parser().parse_args([]))
    assert config.preset == "swe-paper" and config.rewrite_fraction is None
    assert config.sweworkload().rewrite_fraction == load_preset("swe-paper").workload["rewrite_fraction"]
    env = replay.config_from_args(replay.parser().parse_args(["--preset", "env-bound"]))
    assert env.sweworkload().rewrite_fraction == 0.9
    assert replay.config_from_args(replay.parser().parse_args(["--rewrite-fraction", "0"])).sweworkload() \
        .rewrite_fraction == 0.0


def test_training_step_for_16_gpus_is_derived_from_the_papers_8():
    assert systems.model("qwen3-8b").train_step_s == pytest.approx(163.8 * 8 / 16)
    assert systems.model("qwen3-30b-a3b").train_step_s == pytest.approx(1.25 * 163.8 * 8 / 16)


def test_calibrated_profile_slows_the_engines_planning_profile_alike():
    fitted = load_preset("swe-paper").profile_for("qwen3-8b")
    roof = systems.core_profile("qwen3-8b", 64)
    same = systems.core_profile("qwen3-8b", 64, emulator_profile="qwen3-8b-h800-tp2")
    scaled = systems.core_profile("qwen3-8b", 64, emulator_profile=fitted)
    assert same == roof
    from pearl_sglang.emulator.profile import load_profile
    ratio = load_profile(fitted).cost.decode_fixed_s / load_profile("qwen3-8b-h800-tp2").cost.decode_fixed_s
    assert scaled.A == pytest.approx(roof.A * ratio)
