"""The router's view of the work each worker owes, for placement.

Three parts, all from what the data path already sees:

* running: requests in flight per slot (``InFlightRegistry``);
* queued prefill: prompt tokens a worker must still compute for requests sent to it that
  have not produced their first chunk yet;
* owed: trajectories between turns. Their KV is resident where their last turn ran and
  their next turn is coming (an agent waits on its environment), so a worker that looks
  idle between turns is not. A trajectory is owed from the end of one turn until its
  next turn arrives, or ``owed_ttl_s`` later (it may have finished). It is identified by
  its trajectory id, or without one by the last block of its prompt + output (which the
  next turn's prompt starts with).

``snapshot`` turns them into ``core.placement.WorkerLoad`` values, adding what the workers'
own reports (``report``: running + waiting requests from their load endpoint) hold beyond
the router's own requests, so requests from other clients count too. A report is up to
seconds old: the router's own count from when it was read is subtracted, never a later
one, or every turn that ended since would count twice (owed, and running in the report).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable

from pearl_sglang.core.placement import WorkerLoad
from pearl_sglang.router.inflight import InFlightRegistry


@dataclass(frozen=True)
class _Owed:
    slot: int
    until: float


@dataclass(frozen=True)
class WorkerReport:
    """A worker's own count of requests (running + waiting), when it was read, and how many
    of them were the router's own then (the rest came from other clients)."""

    requests: int
    at: float
    own: int = 0

    @property
    def others(self) -> int:
        return max(0, self.requests - self.own)


class LoadModel:
    def __init__(self, inflight: InFlightRegistry, *, owed_ttl_s: float = 60.0, report_ttl_s: float = 5.0,
                 max_owed: int = 1 << 16) -> None:
        self.inflight = inflight
        self.owed_ttl_s = owed_ttl_s
        self.report_ttl_s = report_ttl_s
        self.max_owed = max_owed
        self._prefill: dict[int, int] = {}             # slot -> queued prefill tokens
        self._prefill_by_rid: dict[str, tuple[int, int]] = {}
        self._owed: OrderedDict[Hashable, _Owed] = OrderedDict()  # in order of ``until``
        self._owed_per_slot: dict[int, int] = {}
        self._reports: dict[int, WorkerReport] = {}

    # ---- queued prefill -------------------------------------------------------------------
    def prefill_sent(self, rid: str, slot: int, tokens: int) -> None:
        self.prefill_done(rid)
        if tokens > 0:
            self._prefill_by_rid[rid] = (slot, tokens)
            self._prefill[slot] = self._prefill.get(slot, 0) + tokens

    def prefill_done(self, rid: str) -> tuple[int, int] | None:
        """The slot and tokens of ``rid``'s queued prefill, now done (None: none queued)."""
        entry = self._prefill_by_rid.pop(rid, None)
        if entry is not None:
            slot, tokens = entry
            left = self._prefill[slot] - tokens
            if left:
                self._prefill[slot] = left
            else:
                del self._prefill[slot]
        return entry

    # ---- trajectories between turns ----------------------------------------------------------
    def turn_started(self, trajectory: str | None, key: tuple[int, ...] = ()) -> None:
        """The trajectory (by id, else by the newest of its prompt's blocks that is owed)
        stops being owed: it is running now."""
        owed = self._owed
        if not owed:
            return
        ref: Hashable | None = trajectory
        if trajectory is None:
            ref = next((h for h in reversed(key) if h in owed), None)
        entry = owed.pop(ref, None) if ref is not None else None
        if entry is not None:
            self._uncount(entry.slot)

    def turn_ended(self, ref: Hashable | None, slot: int, now: float) -> None:
        if ref is None:
            return
        old = self._owed.pop(ref, None)
        if old is not None:
            self._uncount(old.slot)
        self._owed[ref] = _Owed(slot, now + self.owed_ttl_s)
        self._owed_per_slot[slot] = self._owed_per_slot.get(slot, 0) + 1
        while len(self._owed) > self.max_owed:
            self._uncount(self._owed.popitem(last=False)[1].slot)

    def _uncount(self, slot: int) -> None:
        n = self._owed_per_slot[slot] - 1
        if n:
            self._owed_per_slot[slot] = n
        else:
            del self._owed_per_slot[slot]

    def _expire(self, now: float) -> None:
        owed = self._owed
        while owed:
            ref, entry = next(iter(owed.items()))
            if entry.until > now:
                return
            del owed[ref]
            self._uncount(entry.slot)

    # ---- worker reports --------------------------------------------------------------------
    def report(self, slot: int, requests: int, now: float, *, own_when_asked: int = 0) -> None:
        """``own_when_asked``: the router's requests on ``slot`` when the worker was asked; the
        worker counted at some moment between then and now, so the larger of that and the
        count now is taken as the router's share (others' load is never overstated)."""
        own = max(own_when_asked, self.inflight.load().get(slot, 0))
        self._reports[slot] = WorkerReport(requests, now, own)

    def forget(self, slot: int) -> None:
        self._reports.pop(slot, None)

    # ---- snapshot --------------------------------------------------------------------------
    def snapshot(self, now: float) -> dict[int, WorkerLoad]:
        if self._owed:
            self._expire(now)
        running, prefill, owed, reports = self.inflight.load(), self._prefill, self._owed_per_slot, self._reports
        out: dict[int, WorkerLoad] = {}
        for slot in {*running, *prefill, *owed, *reports}:
            n = running.get(slot, 0)
            rep = reports.get(slot)
            if rep is not None and now - rep.at <= self.report_ttl_s:
                n += rep.others
            out[slot] = WorkerLoad(prefill.get(slot, 0), n, float(owed.get(slot, 0)))
        return out

    def state(self, now: float) -> dict[str, dict[str, float]]:
        return {str(slot): {"queued_prefill_tokens": w.queued_prefill_tokens, "running": w.running,
                            "owed_trajectories": w.owed}
                for slot, w in sorted(self.snapshot(now).items())}
