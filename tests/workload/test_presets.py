"""Workload presets: named regimes that experiments, the replay CLI and the demo share."""
from __future__ import annotations

import pytest

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.emulator.profile import load_profile
from pearl_sglang.workload import SweWorkload
from pearl_sglang.workload.presets import DEFAULT_PRESET, WorkloadPreset, available_presets, load_preset


def test_bundled_presets_load_with_their_profiles():
    assert {"env-bound", "swe-paper"} <= set(available_presets())
    assert DEFAULT_PRESET == "swe-paper"
    for name in available_presets():
        preset = load_preset(name)
        preset.sweworkload(batch_size=64, group_size=16).validate()
        for model in ("qwen3-8b", "qwen3-30b-a3b"):
            load_profile(preset.profile_for(model))


def test_env_bound_is_the_workload_the_experiments_ran_before():
    """The old regime stays reproducible: SweWorkload's defaults with 90% re-prefill."""
    assert load_preset("env-bound").sweworkload() == SweWorkload(rewrite_fraction=0.9)


def test_swe_paper_records_its_fit_without_headline_results():
    fit = load_preset("swe-paper").fit
    assert set(fit["paper"]) == {"reduction_16_to_24", "reduction_24_to_32", "rollout_share_32",
                                 "mean_trajectory_s", "fig2b_prefill_token_share", "fig2b_prefill_time_share",
                                 "fig2b_decode_tok_s_per_gpu"}
    for name, value in fit["point"].items():  # inside the sourced ranges
        low, high = fit["sources"][name]["range"]
        assert low - 1e-9 <= value <= high + 1e-9 and fit["sources"][name]["source"]


def test_overrides_win_and_bad_presets_are_refused():
    preset = load_preset("env-bound")
    assert preset.sweworkload(rewrite_fraction=0.0, batch_size=8, group_size=4).rewrite_fraction == 0.0
    with pytest.raises(InvalidConfig, match="unknown workload preset"):
        load_preset("nope")
    with pytest.raises(InvalidConfig, match="unknown workload fields"):
        WorkloadPreset("x", "", {"batch_size": 3}, {}).validate()
    with pytest.raises(InvalidConfig, match="no profile for model"):
        preset.profile_for("llama")
