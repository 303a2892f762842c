"""KV transfer link with processor sharing.

A prefill worker sends each finished request's KV to its decode worker over one link
of the profile's bandwidth.  Concurrent transfers share it equally (processor sharing),
which is how many flows through one NIC behave to first order.  The fixed per-transfer
latency is charged as extra bytes at full bandwidth, so an uncontended transfer takes
exactly ``PerformanceModel.kv_transfer_s``.  Pure: times are passed in.
"""
from __future__ import annotations

from typing import Hashable


class SharedLink:
    def __init__(self, *, bandwidth: float, latency_s: float) -> None:
        self.bandwidth = bandwidth
        self.latency_bytes = latency_s * bandwidth
        self._remaining: dict[Hashable, float] = {}
        self._t = 0.0
        self.bytes_done = 0.0
        self.busy_s = 0.0

    def __len__(self) -> int:
        return len(self._remaining)

    def _progress(self, t: float) -> None:
        if t <= self._t:
            return
        n = len(self._remaining)
        if n:
            moved = (t - self._t) * self.bandwidth / n
            for k in self._remaining:
                self._remaining[k] -= moved
            self.busy_s += t - self._t
        self._t = t

    def add(self, key: Hashable, nbytes: float, t: float) -> None:
        self._progress(t)
        self._remaining[key] = nbytes + self.latency_bytes
        self.bytes_done += nbytes

    def remove(self, key: Hashable, t: float) -> None:
        self._progress(t)
        self._remaining.pop(key, None)

    def next_completion(self) -> "float | None":
        if not self._remaining:
            return None
        n = len(self._remaining)
        least = min(self._remaining.values())
        return self._t + max(least, 0.0) * n / self.bandwidth

    def pop_completed(self, t: float) -> list[Hashable]:
        if not self._remaining:  # the common case: nothing in flight
            if t > self._t:
                self._t = t
            return []
        self._progress(t)
        done = [k for k, r in self._remaining.items() if r <= 1.0]  # 1 byte: float slack
        for k in done:
            del self._remaining[k]
        return done
