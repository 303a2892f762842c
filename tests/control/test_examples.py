"""The cluster configurations a user starts from: every example loads, the docstring's
example loads, every key is documented, and the emulated example serves."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from pearl_sglang.control import cluster_config
from pearl_sglang.control.cluster_config import ClusterConfig, ConfigError
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.decision import Thresholds
from pearl_sglang.core.mode_feedback import ModeFeedback
from tests.control.conftest import running_cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("cluster-*.yaml"))
DOC = (REPO / "docs" / "cluster-config.md").read_text()


def test_there_is_an_example_per_kind_of_deployment():
    assert {p.name for p in EXAMPLES} == {"cluster-emulated.yaml", "cluster-sglang-gpu.yaml",
                                          "cluster-sglang-cpu.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads_with_its_starting_profile(path):
    config = ClusterConfig.load(path)
    assert config.profile is not None and config.zones.dedicated
    assert path.name in DOC
    raw = yaml.safe_load(path.read_text())
    assert set(raw["profile"]) == {f.name for f in fields(Profile)}


def test_deadlines_that_nothing_enforces_are_refused_by_name():
    # A join answers when its growth ends and the admission pause is bounded by the router's
    # --admission-wait-s: a deadline for either would be a promise the code does not keep.
    for key in ("join_s", "admission_pause_s"):
        with pytest.raises(ConfigError, match=f"unknown key.*{key}"):
            ClusterConfig.from_mapping({**yaml.safe_load(EXAMPLES[0].read_text()), "deadlines": {key: 30}})


def test_the_docstring_example_loads():
    block = re.search(r"::\n\n((?:    .*\n|\n)+)", cluster_config.__doc__).group(1)
    config = ClusterConfig.from_mapping(yaml.safe_load(block))
    assert config.engine.tp_size == 2 and len(config.zones.overlap) == 4


def test_every_key_is_documented():
    sections = {"engine": cluster_config.EngineConfig, "launcher": cluster_config.LauncherConfig,
                "zones": cluster_config.Zones, "gate": cluster_config.GateConfig,
                "deadlines": cluster_config.Deadlines, "weights": cluster_config.WeightsConfig,
                "recovery": cluster_config.RecoveryConfig, "thresholds": Thresholds,
                "mode_feedback": ModeFeedback}
    missing = [f"{s}.{f.name}" for s, cls in sections.items() for f in fields(cls)
               if f"`{f.name}`" not in DOC and f"`{s}.{f.name}`" not in DOC and f"{s}.{f.name}" not in DOC]
    missing += [f.name for f in fields(ClusterConfig) if f"`{f.name}`" not in DOC and f"## `{f.name}`" not in DOC]
    missing += [f.name for f in fields(Profile) if f"`{f.name}`" not in DOC]
    assert not missing, missing


def test_a_yaml_exponent_without_sign_is_refused_with_the_fix():
    data = yaml.safe_load((REPO / "examples" / "cluster-emulated.yaml").read_text().replace("8.4e+10", "8.4e10"))
    with pytest.raises(ConfigError, match=r"profile.BW .* write it as 8.4e\+10"):
        ClusterConfig.from_mapping(data)


async def test_the_emulated_example_serves(monkeypatch):
    monkeypatch.chdir(REPO)
    config = ClusterConfig.load(REPO / "examples" / "cluster-emulated.yaml")
    async with running_cluster(config, settle_s=120) as c:
        assert c.table.active_topology().total == 2
        out = await c.generate([1, 2, 3], 8)
        assert out["meta_info"]["completion_tokens"] == 8 and out["meta_info"]["weight_version"] == "v0"
