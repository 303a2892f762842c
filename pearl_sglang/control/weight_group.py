"""Distributed weight groups: the trainer broadcasts each tensor once to every worker.

SGLang's protocol is per server: ``/init_weights_update_group`` blocks until every rank of
a torch process group (the trainer is rank 0) has joined, and each
``/update_weights_from_distributed`` receives one broadcast of every named tensor. PEARL
owns the fan-out: it snapshots the active rollout workers as a group's members, gives
each worker ``tp_size`` consecutive ranks after the trainer's, starts every member's init
in the background (it finishes only when the trainer joins) and, on a push, checks the
members are still exactly the routable workers before any of them is asked to receive,
because a broadcast to a group with a missing or extra rank would hang the trainer.

``assign_ranks`` and ``TensorSpecs.validate`` are pure; ``WeightGroups`` is the shell.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Iterable

from pearl_sglang.aio import gather_settled
from pearl_sglang.control.weights import Push
from pearl_sglang.core.state import WorkerRecord
from pearl_sglang.workers.client import WorkerClient
from pearl_sglang.workers.addresses import is_host

log = logging.getLogger("pearl.control")

BACKENDS = ("gloo", "nccl")
DTYPES = frozenset({"float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64",
                    "float8_e4m3fn", "float8_e5m2", "bool"})


class GroupError(Exception):
    """A weight-group request PEARL cannot carry out; subclasses name the reason."""


class InvalidGroupRequest(GroupError):
    """The request itself is malformed (names, dtypes, shapes, address, backend)."""


class UnknownGroup(GroupError):
    pass


class GroupExists(GroupError):
    pass


class MembershipChanged(GroupError):
    """Workers joined or left since the group was set up; the trainer must not broadcast."""


class GroupInitFailed(GroupError):
    """A member could not join the group (or the trainer never did)."""


@dataclass(frozen=True)
class GroupSpec:
    group_name: str
    master_address: str
    master_port: int
    backend: str = "nccl"

    def validate(self) -> None:
        if not self.group_name or len(self.group_name) > 128:
            raise InvalidGroupRequest("'group_name' must be a non-empty string of at most 128 characters")
        if not is_host(self.master_address):
            raise InvalidGroupRequest("'master_address' must be the trainer's host name or IP address "
                                      f"(rank 0), got {self.master_address!r}")
        if not 0 < self.master_port < 65536:
            raise InvalidGroupRequest("'master_port' must be a TCP port in 1..65535")
        if self.backend not in BACKENDS:
            raise InvalidGroupRequest(f"'backend' must be one of {', '.join(BACKENDS)}, got {self.backend!r}")


@dataclass(frozen=True)
class Member:
    slot: int
    endpoint: str
    rank_offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "rank_offset": self.rank_offset}


def assign_ranks(workers: Iterable[WorkerRecord], tp_size: int) -> tuple[tuple[Member, ...], int]:
    """Members in slot order and the world size: rank 0 is the trainer, worker ``i``
    takes ranks ``1 + i*tp_size`` .. ``(i+1)*tp_size``."""
    members = tuple(Member(w.slot, w.endpoint or "", 1 + i * tp_size)
                    for i, w in enumerate(sorted(workers, key=lambda w: w.slot)))
    return members, 1 + len(members) * tp_size


@dataclass(frozen=True)
class TensorSpecs:
    """What one push broadcasts, in order: the trainer sends exactly these tensors."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    def validate(self) -> None:
        if not self.names:
            raise InvalidGroupRequest("'names' must list at least one tensor")
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise InvalidGroupRequest(f"'names', 'dtypes' and 'shapes' must have the same length, got "
                                      f"{len(self.names)}, {len(self.dtypes)} and {len(self.shapes)}")
        if len(set(self.names)) != len(self.names):
            raise InvalidGroupRequest("'names' must not repeat a tensor")
        bad = sorted({d for d in self.dtypes if d not in DTYPES})
        if bad:
            raise InvalidGroupRequest(f"unknown dtype(s) {bad}; use torch names like 'bfloat16'")
        for name, shape in zip(self.names, self.shapes):
            if any(d < 0 for d in shape):
                raise InvalidGroupRequest(f"shape of {name!r} has a negative dimension: {list(shape)}")


@dataclass
class _Group:
    spec: GroupSpec
    members: tuple[Member, ...]
    world_size: int
    init: asyncio.Task

    def describe(self) -> dict[str, Any]:
        state = "joining" if not self.init.done() else (
            "failed" if self.init.cancelled() or _failures(self) else "ready")
        return {"group_name": self.spec.group_name, "world_size": self.world_size, "backend": self.spec.backend,
                "members": [m.to_dict() for m in self.members], "state": state}


def _failures(group: _Group) -> list[tuple[Member, BaseException]]:
    return [(m, r) for m, r in zip(group.members, group.init.result()) if isinstance(r, BaseException)]


class WeightGroups:
    """The distributed weight groups of one control plane, by name."""

    def __init__(self, ops: WorkerClient, *, init_timeout_s: float) -> None:
        self.ops = ops
        self.init_timeout_s = init_timeout_s
        self._groups: dict[str, _Group] = {}

    def init(self, spec: GroupSpec, workers: Iterable[WorkerRecord], tp_size: int) -> dict[str, Any]:
        """Start the members' inits and answer at once; the caller holds the control
        plane's lock, so ``workers`` is the current active set."""
        spec.validate()
        if spec.group_name in self._groups:
            raise GroupExists(f"weight group {spec.group_name!r} exists; destroy it first")
        members, world_size = assign_ranks(workers, tp_size)
        if not members:
            raise MembershipChanged("no active rollout worker to form a weight group with")
        init = asyncio.ensure_future(gather_settled(*(self.ops.init_weight_group(
            m.endpoint, master_address=spec.master_address, master_port=spec.master_port,
            rank_offset=m.rank_offset, world_size=world_size, group_name=spec.group_name,
            backend=spec.backend, timeout_s=self.init_timeout_s) for m in members)))
        self._groups[spec.group_name] = _Group(spec, members, world_size, init)
        return {"group_name": spec.group_name, "world_size": world_size, "backend": spec.backend,
                "members": [m.to_dict() for m in members]}

    async def destroy(self, name: str) -> dict[str, Any]:
        """Forget the group and tear it down on its members (best effort: a member that
        is gone or never joined cannot answer)."""
        group = self._groups.pop(name, None)
        if group is None:
            raise UnknownGroup(f"no weight group named {name!r}")
        if not group.init.done():
            group.init.cancel()
        await asyncio.gather(group.init, return_exceptions=True)
        results = await gather_settled(*(self.ops.destroy_weight_group(m.endpoint, name) for m in group.members))
        return {"group_name": name, "destroyed": True,
                "members": {str(m.slot): "ok" if r is None else str(r) for m, r in zip(group.members, results)}}

    async def ready(self, name: str) -> None:
        """Wait for the group's rendezvous (the trainer joining as rank 0)."""
        group = self._group(name)
        try:
            await asyncio.shield(group.init)
        except asyncio.CancelledError:
            if not group.init.cancelled():
                raise  # this call itself was cancelled
            raise UnknownGroup(f"weight group {name!r} was destroyed while the push waited for it") from None
        failures = _failures(group)
        if failures:
            member, error = failures[0]
            raise GroupInitFailed(f"slot {member.slot} could not join weight group {name!r}: {error}; "
                                  "destroy and re-init the group")

    def pusher(self, name: str, tensors: TensorSpecs, version: str, workers: Iterable[WorkerRecord]) -> Push:
        """The push for each of ``workers``, which must be exactly the group's members
        (the caller passes the active workers now, after ``ready``)."""
        tensors.validate()
        group = self._group(name)
        current = {w.slot: w.endpoint for w in workers}
        recorded = {m.slot: m.endpoint for m in group.members}
        if current != recorded:
            joined = sorted(s for s in current if recorded.get(s) != current[s])
            left = sorted(s for s in recorded if current.get(s) != recorded[s])
            raise MembershipChanged(f"group membership changed (joined: {joined}, left: {left}); destroy and "
                                    f"re-init weight group {name!r} before broadcasting")

        async def push(url: str) -> None:
            await self.ops.update_from_distributed(
                url, group_name=name, names=list(tensors.names), dtypes=list(tensors.dtypes),
                shapes=[list(s) for s in tensors.shapes], version=version)
        return push

    def _group(self, name: str) -> _Group:
        group = self._groups.get(name)
        if group is None:
            raise UnknownGroup(f"no weight group named {name!r}; create it with POST /pearl/weight_group")
        return group

    def describe(self) -> list[dict[str, Any]]:
        return [g.describe() for g in self._groups.values()]

    async def close(self) -> None:
        for group in self._groups.values():
            group.init.cancel()
        await asyncio.gather(*(g.init for g in self._groups.values()), return_exceptions=True)
