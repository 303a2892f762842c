"""How far behind the latest weights a worker may serve: pushes are numbered as adopted.

Purely computational. The control plane adopts a push once its outcome is known (never
while it is in flight, when every worker is momentarily behind); a worker's *lag* is the
number of adopted pushes since the one it holds. The router keeps a worker whose lag is
above ``max_staleness`` out of routing; the control plane re-syncs or replaces it.

Invariants: the latest adopted version has lag 0; adopting a push raises every other
version's lag by one; a version the log does not know (never adopted, or too old to be
remembered) is treated as beyond any bound, so unknown weights never serve.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PushLog:
    """The versions of the last ``max_staleness + 1`` adopted pushes, newest last (a
    version pushed twice appears twice); ``number`` counts every adoption (the launch
    weights are push 0). A push normally holds one version; the starting point after a
    restart holds every version the surviving workers report, since the record may
    predate a push that reached them."""

    pushes: tuple[frozenset[str], ...]
    number: int = 0
    max_staleness: int = 0

    @classmethod
    def start(cls, version: str, *, max_staleness: int = 0, also: tuple[str, ...] = ()) -> "PushLog":
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")
        return cls(pushes=(frozenset((version, *also)),), number=0, max_staleness=max_staleness)

    def to_dict(self) -> dict:
        return {"number": self.number, "pushes": [sorted(push) for push in self.pushes]}

    @classmethod
    def from_dict(cls, data: dict, *, max_staleness: int = 0, also: tuple[str, ...] = ()) -> "PushLog":
        """The log as recorded; versions in ``also`` (what the surviving workers report)
        that it does not know count as the newest push: the record may predate a push
        that reached them."""
        pushes = tuple(frozenset(p) for p in data["pushes"]) or (frozenset(),)
        newest = pushes[-1] | frozenset(v for v in also if not any(v in p for p in pushes))
        return cls(pushes=(pushes[:-1] + (newest,))[-(max_staleness + 1):], number=int(data["number"]),
                   max_staleness=max_staleness)

    @property
    def versions(self) -> tuple[str, ...]:
        """Every servable version, oldest push first."""
        return tuple(v for push in self.pushes for v in sorted(push))

    def adopt(self, version: str) -> "PushLog":
        kept = self.pushes + (frozenset((version,)),)  # a re-push of a version counts as a push
        return PushLog(pushes=kept[-(self.max_staleness + 1):], number=self.number + 1,
                       max_staleness=self.max_staleness)

    def lag(self, version: str | None) -> int | None:
        """Adopted pushes since ``version``; None when the log does not know it."""
        for lag, push in enumerate(reversed(self.pushes)):
            if version in push:
                return lag
        return None

    def servable(self, version: str | None) -> bool:
        lag = self.lag(version)
        return lag is not None and lag <= self.max_staleness
