"""What each worker did between two moments, as the router sees it: how many sequences it
was decoding and over how many context tokens (time averages), and the prefill tokens it
finished.

Telemetry fits the engine's rates from a turn's timing, and what the worker did meanwhile
decides what that timing means. A turn's decode ran at the worker's batch *during* its
decode, not at the count when it was sent; an iteration's cost grows with the context
tokens it attends over, not only with its sequences (measured on an emulated pool: long
late turns ran at low concurrency, short early ones at high, so time per token against
the count alone came out flat); and the other turns' prefills, which take priority,
stretched it. A turn's wait for its first token holds the prefills finished ahead of its
own. ``mark`` a slot when a window opens and again when it closes; ``between`` gives the
window's means and the prefill tokens finished in it.

A request decodes on its main worker from its first chunk to its end
(``decode_started`` / ``decode_ended`` with its context); its prefill counts as finished
on its prefix holder at its first chunk (``prefilled``, the tokens the worker computed).
"""
from __future__ import annotations

from typing import Callable, NamedTuple


class Mark(NamedTuple):
    at: float
    sequences_s: float   # integral of the decoding sequences up to ``at``
    context_s: float     # integral of their context tokens
    prefilled: int       # prefill tokens finished up to ``at``


class Window(NamedTuple):
    seconds: float
    sequences: float     # mean decoding sequences
    context_tokens: float  # mean context tokens over them
    prefilled: int


def between(start: Mark, end: Mark) -> Window:
    seconds = end.at - start.at
    prefilled = max(0, end.prefilled - start.prefilled)
    if seconds <= 0:
        return Window(0.0, 0.0, 0.0, prefilled)
    return Window(seconds, max(0.0, (end.sequences_s - start.sequences_s) / seconds),
                  max(0.0, (end.context_s - start.context_s) / seconds), prefilled)


class _Slot:
    __slots__ = ("since", "sequences", "context", "sequences_s", "context_s", "prefilled")

    def __init__(self, now: float) -> None:
        self.since = now
        self.sequences = 0
        self.context = 0
        self.sequences_s = 0.0
        self.context_s = 0.0
        self.prefilled = 0

    def advance(self, now: float) -> None:
        dt = now - self.since
        self.sequences_s += self.sequences * dt
        self.context_s += self.context * dt
        self.since = now


class WorkerActivity:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._slots: dict[int, _Slot] = {}

    def _slot(self, slot: int, now: float) -> _Slot:
        s = self._slots.get(slot)
        if s is None:
            s = self._slots[slot] = _Slot(now)
        s.advance(now)
        return s

    def decode_started(self, slot: int, context_tokens: int) -> None:
        s = self._slot(slot, self.clock())
        s.sequences += 1
        s.context += context_tokens

    def decode_ended(self, slot: int, context_tokens: int) -> None:
        s = self._slot(slot, self.clock())
        s.sequences -= 1
        s.context -= context_tokens

    def prefilled(self, slot: int, tokens: int) -> None:
        if tokens > 0:
            self._slot(slot, self.clock()).prefilled += tokens

    def mark(self, slot: int) -> Mark:
        now = self.clock()
        s = self._slots.get(slot)
        if s is None:
            return Mark(now, 0.0, 0.0, 0)
        dt = now - s.since
        return Mark(now, s.sequences_s + s.sequences * dt, s.context_s + s.context * dt, s.prefilled)


class TurnWindows:
    """One request's two windows: from its dispatch to its first chunk on its prefix holder
    (the prefills finished ahead of its own), and its decode on its main worker from its
    first chunk to its end (what it decoded beside). A request that moves between workers
    has no decode window: its decode ran on two batches."""

    def __init__(self, activity: WorkerActivity) -> None:
        self.activity = activity
        self.queued_prefill = 0
        self.first_chunk_tokens = 0
        self._sent: Mark | None = None
        self._decoding: tuple[int, int, Mark] | None = None
        self._in_batch = False   # counted in its decode worker's batch
        self._moved = False      # its decode ran on more than one worker

    def sent(self, holder: int) -> None:
        self._sent = self.activity.mark(holder)

    def first_chunk(self, holder: int, main: int, computed: int, context: int, tokens: int) -> None:
        """The prefix holder finished this request's ``computed`` prefill tokens; its decode
        of ``context`` tokens starts on ``main``; the chunk carried ``tokens``."""
        act = self.activity
        self.first_chunk_tokens = tokens
        if self._sent is not None:
            self.queued_prefill = between(self._sent, act.mark(holder)).prefilled
        act.prefilled(holder, computed)
        act.decode_started(main, context)
        self._decoding = (main, context, act.mark(main))
        self._in_batch = True

    def decode_window(self) -> Window | None:
        if self._decoding is None or self._moved:
            return None
        slot, _, start = self._decoding
        return between(start, self.activity.mark(slot))

    def stop(self, *, moved: bool = False) -> None:
        """The attempt ended (``moved``: another follows) or the request did. A move before
        the first chunk keeps the decode window (the decode runs whole on the next worker)."""
        if self._in_batch and self._decoding is not None:
            slot, context, _ = self._decoding
            self.activity.decode_ended(slot, context)
            self._in_batch = False
            self._moved = self._moved or moved
