"""The PD mode: how the rollout GPUs are split between prefill and decode.

``auto``: the decision engine chooses, with hysteresis; ``colocated`` and ``disaggregated``
pin the mode (the engine still picks the PD ratio); ``P:D`` (positive integers) pins the
ratio, scaled to the budget. A ``PdMode`` is the string as the operator wrote it (configs,
admin answers and decision reasons carry it unchanged), checked once where it enters.
"""
from __future__ import annotations

from pearl_sglang.core.errors import InvalidConfig

AUTO, COLOCATED, DISAGGREGATED = "auto", "colocated", "disaggregated"


def _ratio(text: str) -> tuple[int, int] | None:
    p, sep, d = text.partition(":")
    if sep and _count(p) and _count(d):
        return int(p), int(d)
    return None


def _count(text: str) -> bool:
    """1..9999 in ASCII digits (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return text.isascii() and text.isdigit() and len(text) <= 4 and int(text) > 0


class PdMode(str):
    def __new__(cls, value: str) -> PdMode:
        if isinstance(value, PdMode):
            return value
        if not isinstance(value, str) or (value not in (AUTO, COLOCATED, DISAGGREGATED) and _ratio(value) is None):
            raise InvalidConfig(f"pd_mode must be auto, colocated, disaggregated or a fixed P:D ratio "
                                f"such as '3:5', got {value!r}")
        return super().__new__(cls, value)

    @property
    def ratio(self) -> tuple[int, int] | None:
        """(P, D) of a fixed ratio; None for the named modes."""
        return _ratio(self)
