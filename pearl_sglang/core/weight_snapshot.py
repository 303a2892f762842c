"""The weights rollout workers serve: a version and where to load it from.

PEARL keeps only this; joining and re-activated workers sync to the latest snapshot some
worker loaded (``control/weights.py`` does the loading).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightSnapshot:
    version: str
    model_path: str | None = None
    load_format: str | None = None
    group: str | None = None  # the distributed weight group it was broadcast over, if any

    @property
    def reloadable(self) -> bool:
        """Whether a worker that missed this snapshot can still load it."""
        return self.model_path is not None or self.group is None

    def to_dict(self) -> dict:
        out = {"version": self.version, "model_path": self.model_path, "load_format": self.load_format,
               "group": self.group, "joiners_can_sync": self.reloadable}
        if not self.reloadable:
            out["note"] = (f"{self.version} was broadcast over group {self.group!r} without a disk copy "
                           "('model_path'): workers that join or are re-activated cannot load it, so "
                           "their activation fails until the next push with a model_path")
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "WeightSnapshot":
        return cls(version=data["version"], model_path=data.get("model_path"),
                   load_format=data.get("load_format"), group=data.get("group"))
