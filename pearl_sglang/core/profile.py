"""The runtime profile: the paper's symbols, in one typed, validated object.

The decision engine sees only this object: what a deployment can observe (fitted by
``telemetry``) plus static facts about the model and the hardware.  Units, all SI:

==========  ===========================================================  ============
symbol      meaning                                                      unit
==========  ===========================================================  ============
B           trajectories in a rollout batch                              count
S           interaction turns of the slowest trajectory                  turns
delta_L     tokens each turn adds to the prefill work (effective, i.e.    tokens
            not served from the prefix cache)
r           tokens generated per turn                                    tokens
theta       bubble ratio (1 - f) / f, f = fraction of live trajectories  1
            actively decoding
A           fixed cost of one decode iteration of one worker             s
b           extra cost of one more concurrent sequence in an iteration   s / sequence
t_prefill   prefill time per token on one worker                         s / token
K           KV-cache bytes transferred per prefilled token               bytes / token
BW          bandwidth between the prefill and the decode pool            bytes / s
T_over      per-turn colocation overhead (prefill/decode switching)      s
T_env       environment time along the slowest trajectory (whole step)   s
K_seq       KV-cache bytes one trajectory occupies on its decode worker  bytes
H_max       HBM bytes one worker can devote to KV cache                  bytes
==========  ===========================================================  ============

A "worker" is one serving instance (TP2 in the paper's setup), so ``t_prefill``, ``A``,
``b`` and ``H_max`` are per instance, not per GPU.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from pearl_sglang.core.errors import InvalidProfile

# Symbols that must be strictly positive; every other symbol may be zero.
_POSITIVE = frozenset({"B", "S", "BW", "H_max"})


@dataclass(frozen=True)
class Profile:
    B: float
    S: float
    delta_L: float
    r: float
    theta: float
    A: float
    b: float
    t_prefill: float
    K: float
    BW: float
    T_over: float
    T_env: float
    K_seq: float
    H_max: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidProfile(f"{f.name} must be a number, got {value!r}", key=f.name)
            if not math.isfinite(value):
                raise InvalidProfile(f"{f.name} must be finite, got {value!r}", key=f.name)
            if f.name in _POSITIVE and value <= 0:
                raise InvalidProfile(f"{f.name} must be > 0, got {value!r}", key=f.name)
            if value < 0:
                raise InvalidProfile(f"{f.name} must be >= 0, got {value!r}", key=f.name)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Profile":
        """Build from a mapping holding exactly the profile symbols (extra keys rejected)."""
        names = [f.name for f in fields(cls)]
        for name in names:
            if name not in data:
                raise InvalidProfile(f"missing profile key {name!r}", key=name)
        extra = sorted(set(data) - set(names))
        if extra:
            raise InvalidProfile(f"unknown profile key {extra[0]!r}", key=extra[0])
        return cls(**{name: data[name] for name in names})

    @classmethod
    def symbols(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
