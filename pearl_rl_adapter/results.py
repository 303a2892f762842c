"""Typed answers of the admin API (docs/admin-api.md), built from the router's JSON.

Parsers are strict about the fields a trainer acts on and ignore the rest, so the
router can add fields without breaking deployed trainers. A missing or mistyped field
raises ``KeyError``/``TypeError``/``ValueError``; ``protocol.decode`` turns that into a
``PearlProtocolError``.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from types import MappingProxyType
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class TrainBegun:
    step: int
    returned_gpus: tuple[str, ...]
    elapsed_s: float
    duplicate: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TrainBegun":
        return cls(step=int(data["step"]), returned_gpus=tuple(str(g) for g in data.get("returned_gpus", ())),
                   elapsed_s=float(data.get("elapsed_s", 0.0)), duplicate=bool(data.get("duplicate", False)))


@dataclass(frozen=True)
class TrainFinished:
    step: int
    borrowing: bool
    reason: str
    duplicate: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TrainFinished":
        return cls(step=int(data["step"]), borrowing=bool(data["borrowing"]), reason=str(data.get("reason", "")),
                   duplicate=bool(data.get("duplicate", False)))


@dataclass(frozen=True)
class WeightsUpdated:
    version: str
    workers: Mapping[str, str]
    latest: str

    @property
    def failed(self) -> Mapping[str, str]:
        """Workers that did not load the weights, with their error (the router keeps
        them out of admission until they sync, so a partial failure is not fatal)."""
        return {slot: status for slot, status in self.workers.items() if status != "ok"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WeightsUpdated":
        workers = {str(k): str(v) for k, v in dict(data.get("workers", {})).items()}
        return cls(version=str(data["version"]), workers=MappingProxyType(workers),
                   latest=str(data.get("latest", data["version"])))


@dataclass(frozen=True)
class GpusJoined:
    """What happened to the joined GPUs. The call waits while later events (joins,
    leaves, train_begin, PD-mode changes) take over the expansion that carries them, so
    ``admitted`` lists the workers serving on them now, and ``cancelled`` means none
    will unless a later event re-plans (``reason`` says why: a failed start, the GPUs
    left first). ``expansion`` numbers the growth that decided, and ``superseded_by``
    names the events that took over before it, in order."""

    admitted: tuple[str, ...]
    cancelled: bool
    reason: str | None
    expansion: int | None = None
    superseded_by: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GpusJoined":
        expansion = data.get("expansion")
        return cls(admitted=tuple(str(s) for s in data.get("admitted", ())),
                   cancelled=bool(data.get("cancelled", False)), reason=data.get("reason"),
                   expansion=None if expansion is None else int(expansion),
                   superseded_by=tuple(str(e) for e in data.get("superseded_by", ())))


@dataclass(frozen=True)
class GpusLeft:
    removed: tuple[str, ...]
    elapsed_s: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GpusLeft":
        return cls(removed=tuple(str(s) for s in data.get("removed", ())), elapsed_s=float(data.get("elapsed_s", 0.0)))


@dataclass(frozen=True)
class DistributedWeights:
    """One push over a weight group: the tensors the trainer broadcasts from rank 0, in
    this order, while ``update_weights_from_distributed`` runs."""

    names: Sequence[str]
    dtypes: Sequence[str]
    shapes: Sequence[Sequence[int]]
    group_name: str

    def to_json(self) -> dict[str, Any]:
        """The push's ``distributed`` body; ``ValueError`` for what no push can carry.
        ``dtypes`` may be torch dtypes (sent as their names)."""
        def listed(value: Any, what: str) -> list[Any]:
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ValueError(f"{what}, got {value!r}")
            return list(value)

        per_tensor = "must be a list with one entry per tensor"
        names, dtypes = listed(self.names, f"names {per_tensor}"), listed(self.dtypes, f"dtypes {per_tensor}")
        shapes = listed(self.shapes, f"shapes {per_tensor}")
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError("names, dtypes and shapes must have the same length")
        if not names:
            raise ValueError("a push needs at least one tensor")
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"names must be non-empty strings, got {names!r}")
        if not isinstance(self.group_name, str) or not self.group_name:
            raise ValueError(f"group_name must be a non-empty string, got {self.group_name!r}")
        dims = [listed(s, "each shape must be a list of dimensions") for s in shapes]
        if not all(isinstance(d, Integral) and not isinstance(d, bool) and d >= 0 for s in dims for d in s):
            raise ValueError(f"shapes must be lists of non-negative ints, got {shapes!r}")
        return {"group_name": self.group_name, "names": names, "dtypes": [str(d) for d in dtypes],
                "shapes": [[int(d) for d in s] for s in dims]}


@dataclass(frozen=True)
class WeightGroupMember:
    slot: int
    rank_offset: int


@dataclass(frozen=True)
class WeightGroup:
    """A distributed weight group PEARL set up over its active workers; the trainer joins
    it as rank 0 of ``world_size`` ranks (see docs/adapter.md)."""

    group_name: str
    world_size: int
    members: tuple[WeightGroupMember, ...]
    backend: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WeightGroup":
        members = tuple(WeightGroupMember(slot=int(m["slot"]), rank_offset=int(m["rank_offset"]))
                        for m in data["members"])
        return cls(group_name=str(data["group_name"]), world_size=int(data["world_size"]), members=members,
                   backend=str(data.get("backend", "nccl")))


@dataclass(frozen=True)
class WeightGroupDestroyed:
    group_name: str
    members: Mapping[str, str]  # slot -> "ok" or why the member could not tear it down

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WeightGroupDestroyed":
        members = {str(k): str(v) for k, v in dict(data.get("members", {})).items()}
        return cls(group_name=str(data["group_name"]), members=MappingProxyType(members))


def state_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """``/pearl/state`` is a diagnostic view whose shape the router owns; pass it on."""
    return dict(data)
