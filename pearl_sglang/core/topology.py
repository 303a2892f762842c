"""Rollout topologies: how many prefill, decode and colocated workers serve rollout.

A topology is only counts; which physical workers hold the roles is the planner's
business.  Valid topologies are the paper's feasible shapes (section 4.2): fully
colocated (``N_P = N_D = 0``, ``N_C >= 1``) or fully disaggregated (``N_C = 0``,
``N_P >= 1``, ``N_D >= 1``).  Invalid counts are still representable, because the table
can be left in such a shape by a failure (the last prefill worker leaves) and the
decision engine must recognise that and force a switch.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from pearl_sglang.core.errors import InvalidConfig


class Mode(str, Enum):
    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


@dataclass(frozen=True)
class Topology:
    prefill: int = 0
    decode: int = 0
    colocated: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill", "decode", "colocated"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidConfig(f"{name} must be a non-negative integer, got {value!r}", key=name)

    @classmethod
    def coloc(cls, n: int) -> "Topology":
        return cls(colocated=n)

    @classmethod
    def pd(cls, prefill: int, decode: int) -> "Topology":
        return cls(prefill=prefill, decode=decode)

    @property
    def total(self) -> int:
        return self.prefill + self.decode + self.colocated

    @property
    def mode(self) -> Mode | None:
        """The mode these counts describe, or None for an empty or mixed shape."""
        if self.colocated and not (self.prefill or self.decode):
            return Mode.COLOCATED
        if not self.colocated and (self.prefill or self.decode):
            return Mode.DISAGGREGATED
        return None

    @property
    def is_valid(self) -> bool:
        if self.mode is Mode.COLOCATED:
            return True
        return self.mode is Mode.DISAGGREGATED and self.prefill >= 1 and self.decode >= 1

    def label(self) -> str:
        """Short human form used in reasons and docs: ``3P5D``, ``8C``, ``1P0D+2C``."""
        if self.mode is Mode.COLOCATED:
            return f"{self.colocated}C"
        text = f"{self.prefill}P{self.decode}D"
        return text + (f"+{self.colocated}C" if self.colocated else "")

    def to_dict(self) -> dict[str, Any]:
        mode = self.mode
        return {
            "mode": mode.value if mode else None,
            "prefill": self.prefill,
            "decode": self.decode,
            "colocated": self.colocated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, default_colocated: int | None = None) -> "Topology":
        """Read ``{"mode", "prefill", "decode", "colocated"?}``.

        A colocated entry may omit its count; ``default_colocated`` (the budget, in the
        CLI) fills it, because a colocated deployment is described by its size alone.
        """
        mode_raw = data.get("mode")
        try:
            mode = Mode(mode_raw) if mode_raw is not None else None
        except ValueError as e:
            raise InvalidConfig(f"unknown mode {mode_raw!r}", key="mode") from e
        prefill = data.get("prefill", 0)
        decode = data.get("decode", 0)
        colocated = data.get("colocated")
        if mode is Mode.COLOCATED:
            if prefill or decode:
                raise InvalidConfig("a colocated topology has no prefill or decode workers", key="mode")
            colocated = default_colocated if colocated is None else colocated
            if colocated is None:
                raise InvalidConfig("a colocated topology needs a 'colocated' count", key="colocated")
        elif mode is Mode.DISAGGREGATED and colocated:
            raise InvalidConfig("a disaggregated topology has no colocated workers", key="mode")
        return cls(prefill=prefill, decode=decode, colocated=colocated or 0)
