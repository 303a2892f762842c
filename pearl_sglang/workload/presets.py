"""Named regimes of the emulated workload: the SWE workload's shape plus the emulated
workers' performance profile per model.

A benchmark result only means something next to the regime it came from, so experiments,
the replay CLI and the demo name a preset instead of scattering workload numbers.
Presets are data (``presets/<name>.json``): ``env-bound`` is the hand-set workload the
project started with (long environment tail, short responses, roofline engines);
``swe-paper`` is written by ``python -m benchmarks.calibrate``, fitted to the paper's
measurements of its own regime (section 3), with the fit and each parameter's source in
the file.  Pure: loading reads a bundled file, nothing else.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.workload.swe import SweWorkload

PRESET_DIR = Path(__file__).with_name("presets")
DEFAULT_PRESET = "swe-paper"
# Fields a preset may set; batch, group and seed belong to the experiment.
_WORKLOAD_FIELDS = frozenset(f.name for f in fields(SweWorkload)) - {"batch_size", "group_size", "seed"}


@dataclass(frozen=True)
class WorkloadPreset:
    name: str
    description: str
    workload: Mapping[str, Any]            # SweWorkload fields
    profiles: Mapping[str, str]            # model name -> emulator profile name
    fit: Mapping[str, Any] = field(default_factory=dict)   # how it was fitted (calibrated presets)

    def validate(self) -> None:
        unknown = set(self.workload) - _WORKLOAD_FIELDS
        if unknown:
            raise InvalidConfig(f"preset {self.name}: unknown workload fields {sorted(unknown)}", key="workload")
        self.sweworkload().validate()

    def sweworkload(self, **overrides: Any) -> SweWorkload:
        """The preset's workload; ``overrides`` (batch, group, seed, any field) win."""
        body = {**self.workload, **overrides}
        return SweWorkload(**{k: tuple(v) if isinstance(v, list) else v for k, v in body.items()})

    def profile_for(self, model: str) -> str:
        try:
            return self.profiles[model]
        except KeyError:
            raise InvalidConfig(f"preset {self.name} has no profile for model {model!r} "
                                f"(has {sorted(self.profiles)})", key="model") from None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "workload": dict(self.workload),
                "profiles": dict(self.profiles), "fit": dict(self.fit)}


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_preset(name: str) -> WorkloadPreset:
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise InvalidConfig(f"unknown workload preset {name!r}; bundled: {', '.join(available_presets())}",
                            key="preset")
    data = json.loads(path.read_text(encoding="utf-8"))
    preset = WorkloadPreset(name=data["name"], description=data.get("description", ""),
                            workload=data["workload"], profiles=data["profiles"], fit=data.get("fit", {}))
    preset.validate()
    return preset


def write_preset(preset: WorkloadPreset, directory: Path = PRESET_DIR) -> Path:
    preset.validate()
    path = directory / f"{preset.name}.json"
    path.write_text(json.dumps(preset.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path
