"""Counters behind /metrics and /v1/loads (gen_throughput over a sliding window).

The phase counters split busy time between iterations that prefill (alone or mixed with
decode) and decode-only ones, the way a timeline of the engine shows them: the paper's
Figure 2(b) measures prefill's share of tokens and of time, and decode's rate between
prefill insertions, from exactly that split."""
from __future__ import annotations

from collections import deque
from functools import reduce
from itertools import repeat
from operator import add

from .request import RequestHandle
from .scheduler import Iteration


class Stats:
    WINDOW_S = 5.0

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.aborted = 0
        self.iterations = 0
        self.busy_s = 0.0
        self.kv_bytes = 0
        self.kv_transfers = 0
        self.prefill_tokens = 0          # prompt tokens computed (not served from the cache)
        self.prefill_iteration_s = 0.0   # iterations that prefill, mixed ones included
        self.decode_only_s = 0.0
        self.decode_only_tokens = 0
        self._window: deque[tuple[float, int, float]] = deque()

    def iteration(self, t: float, it: Iteration, tokens: int) -> None:
        self.record(t, it.duration, tokens, prefill_tokens=sum(n for _, n in it.prefill))

    def record(self, t: float, duration: float, tokens: int, *, prefill_tokens: int = 0) -> None:
        """An iteration of ``duration`` seconds that ended at ``t`` with ``tokens`` tokens
        generated and ``prefill_tokens`` prompt tokens computed."""
        self.iterations += 1
        if prefill_tokens:
            self.prefill_tokens += prefill_tokens
            self.prefill_iteration_s += duration
        else:
            self.decode_only_s += duration
            self.decode_only_tokens += tokens
        self.busy_s += duration
        self.generation_tokens += tokens
        self._window.append((t, tokens, duration))
        while self._window and self._window[0][0] < t - self.WINDOW_S:
            self._window.popleft()

    def record_decode_run(self, ends: list[float], durations: list[float], tokens: int) -> None:
        """``record`` of decode-only iterations ``ends[i]``/``durations[i]`` with ``tokens``
        each, in order: the same sums, added in the same order, and the same window (which
        only drops entries older than the last end's window)."""
        window = self._window
        self.decode_only_s = reduce(add, durations, self.decode_only_s)  # left to right, as record adds
        self.busy_s = reduce(add, durations, self.busy_s)
        window.extend(zip(ends, repeat(tokens), durations))
        n = len(ends)
        self.iterations += n
        self.decode_only_tokens += n * tokens
        self.generation_tokens += n * tokens
        if n:
            floor = ends[-1] - self.WINDOW_S
            while window and window[0][0] < floor:
                window.popleft()

    def finished(self, h: RequestHandle) -> None:
        self.requests += 1
        self.cached_tokens += h.cached_tokens
        if h.finish_reason is not None and h.finish_reason.type == "abort":
            self.aborted += 1

    def phases(self) -> dict[str, float]:
        """Tokens and seconds by phase, for a timeline-style split of the worker's work."""
        return {"prefill_tokens": self.prefill_tokens, "generated_tokens": self.generation_tokens,
                "prefill_iteration_s": self.prefill_iteration_s, "decode_only_s": self.decode_only_s,
                "decode_only_tokens": self.decode_only_tokens, "busy_s": self.busy_s}

    def kv_transfer(self, nbytes: int) -> None:
        self.kv_bytes += nbytes
        self.kv_transfers += 1

    def window(self, now: float) -> tuple[float, float]:
        """(generated tokens/s, busy fraction) over the last WINDOW_S seconds."""
        recent = [(t, n, d) for t, n, d in self._window if t >= now - self.WINDOW_S]
        if not recent:
            return 0.0, 0.0
        span = max(now - (recent[0][0] - recent[0][2]), 1e-9)
        return sum(n for _, n, _ in recent) / span, min(1.0, sum(d for *_, d in recent) / span)
