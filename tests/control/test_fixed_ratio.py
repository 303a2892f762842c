"""``pd_mode: "P:D"`` pins the prefill:decode ratio (the PD sweep and ratio selection)."""
from __future__ import annotations

import pytest

from pearl_sglang.control.cluster_config import ClusterConfig, ConfigError
from pearl_sglang.core.policy import target_topology
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.state import StateTable
from pearl_sglang.core.topology import Topology
from tests.control.conftest import PROFILE, cluster_config


def test_fixed_ratio_parses_positive_pairs_only():
    assert PdMode("3:5").ratio == (3, 5)
    for named in ("auto", "colocated", "disaggregated"):
        assert PdMode(named).ratio is None and PdMode(named) == named
    for bad in ("0:3", "3:0", "a:b", "3:", ":3", "3:5:1", "-1:2", "pd", "", None, 3,
                "\u00b2:1", "1:\u00b3", "\u0661:\u0661", "99999:1", "1:" + "9" * 50):
        with pytest.raises(InvalidConfig, match="pd_mode"):
            PdMode(bad)


@pytest.mark.parametrize("mode", ["2:0", "x:y", "pd"])
def test_config_refuses_bad_pd_modes(tmp_path, mode):
    with pytest.raises(ConfigError, match="pd_mode"):
        cluster_config(tmp_path, pd_mode=mode)


@pytest.mark.parametrize("mode, budget, expect", [
    ("3:5", 8, Topology.pd(3, 5)),
    ("1:3", 4, Topology.pd(1, 3)),
    ("7:1", 2, Topology.pd(1, 1)),      # at least one of each
    ("1:7", 4, Topology.pd(1, 3)),
    ("1:1", 1, Topology.coloc(1)),      # one worker cannot disaggregate
])
def test_policy_scales_the_ratio_to_the_budget(tmp_path, mode, budget, expect):
    config = cluster_config(tmp_path, dedicated=8, overlap=0, pd_mode=mode)
    table = StateTable.create(tp_size=1, dedicated_gpus=config.zones.dedicated, overlap_gpus=())
    decision = target_topology(config.decisions, table, Profile.from_dict(PROFILE), budget)
    assert decision.choice == expect
    assert decision.reason == f"pd_mode={mode}"


@pytest.mark.parametrize("gpu", ["d0", ":0", "d0:", "d0:\u00b2", "d 0:0", "d0:0:1", "d0:12345"])
def test_config_refuses_malformed_gpu_ids(tmp_path, gpu):
    with pytest.raises(ConfigError, match="GPU ids"):
        ClusterConfig.from_mapping({
            "engine": {"kind": "emulator", "model_path": str(tmp_path), "tp_size": 1},
            "zones": {"dedicated": ["d0:0", gpu]}, "profile": PROFILE})
