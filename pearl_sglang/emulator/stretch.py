"""Decode stretches: many decode iterations of an unchanging batch as one engine event.

Most of a replay's engine events are decode iterations in which nothing happens that
anyone can see: no request arrives, finishes, streams a chunk or is retracted.  While the
batch cannot change, the next iterations are fully determined by the current state: the
k-th iteration's context is the first one's plus ``(k-1) * batch``, so its duration is the
profile's ``decode_s`` of that, and each request's tokens follow from its context hash.
``plan_stretch`` computes such a run of iterations up front (end times summed one by one,
exactly as stepping would add them) and the engine reports only its last iteration as an
event.  Anyone who looks before then (every public engine call first advances to its
time) sees the state that stepping would have had: ``commit`` applies the iterations that
ended by then, and the engine cuts the stretch short if the call changes anything.

The stretch stops short of every change: a request's token-dependent stop (EOS, a stop
id) or length limit, a stream chunk its caller waits for (``RequestHandle.notify_at``),
the KV pool running out (decode would retract; the prefix-cache pages that stepping
evicts one iteration at a time, ``commit`` evicts the same way), a transfer or timer of the
engine, and any queued admission that could start.  Its last iteration is an ordinary
``Iteration``, completed by the engine's usual code, so finishes and callbacks happen
exactly as before.  Requests with stop strings are never stretched (their check decodes
text).  A caller that keeps no chunks (``RequestHandle.progress_every``) ends no stretch:
``commit`` records the last progress mark its iterations passed, as stepping would have.
Pure apart from the handles and scheduler state that ``commit`` updates.

The tokens of the whole batch are drawn in one compiled call (``stretch_draws``): the
same 64-bit arithmetic and rules as ``tokens.draw``, so the same ids.  The context hashes
after each token are kept, so committing does not hash the tokens again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .scheduler import Iteration, Req, Scheduler
from .stats import Stats
from .stretch_draws import draw_runs

# Tokens drawn ahead per request at most; bounds the work a cut-short stretch wastes.
MAX_STRETCH = 512


@dataclass
class DecodeStretch:
    """Iterations ``1..K`` of one decode batch; ``done`` of them are committed."""

    batch: list[Req]
    tokens: list[list[int]]  # per request, the tokens of iterations 1..K-1
    hashes: list[list[int]]  # per request, its context hash after each of those tokens
    ends: list[float]        # end time of each iteration
    durations: list[float]
    context_tokens: int      # of iteration 1
    done: int = 0

    @property
    def end(self) -> float:
        return self.ends[-1]

    def in_progress(self) -> Iteration:
        """The iteration after the committed ones, as stepping would have planned it."""
        k = self.done
        return Iteration(decode=list(self.batch), duration=self.durations[k],
                         context_tokens=self.context_tokens + k * len(self.batch))

    def due(self, t: float) -> int:
        """Iterations of the bulk (all but the last) that have ended by ``t`` and are not committed."""
        n, last = self.done, len(self.ends) - 1
        while n < last and self.ends[n] <= t:
            n += 1
        return n - self.done


def _bound(sched: Scheduler, r: Req) -> int:
    """Iterations after which ``r`` ends its stretch at the latest (deterministic limits)."""
    sp, h = r.req.sampling, r.handle
    n = len(h.output_ids)
    k = min(sp.max_new_tokens - n,
            min(sched.context_length, sched.capacity - 1) - len(r.prompt) - n)
    if h.on_update is not None:
        k = min(k, h.notify_at - n)
    return k


def plan_stretch(sched: Scheduler, it: Iteration, start: float, limit: Optional[float]) -> Optional[DecodeStretch]:
    """A stretch beginning with the decode iteration ``it`` just planned at ``start``, ending
    by ``limit`` (the engine's next other event); None when it would be one iteration."""
    batch = it.decode
    b = len(batch)
    # Each later iteration needs a KV token per request, from free space or, as stepping
    # does it, from prefix-cache pages evicted for it (``commit``); never a retraction.
    kmax = min(MAX_STRETCH, sched.available() // b + 1)
    for r in batch:
        if r.req.sampling.stop:
            return None
        kmax = min(kmax, _bound(sched, r))
    if kmax < 2:
        return None
    cost, ctx = sched.cost, it.context_tokens
    ends, durations = [start + it.duration], [it.duration]
    # ``cost.decode_s(b, c)`` of each later iteration, its batch terms computed once.
    fixed, per_ctx, e = cost.decode_batch_s(b), cost.decode_per_ctx_token_s, ends[0]
    end_by = float("inf") if limit is None else limit
    for c in range(ctx + b, ctx + kmax * b, b):
        d = fixed + per_ctx * c
        e += d
        if e > end_by:
            break
        ends.append(e)
        durations.append(d)
    k = len(ends)
    if k < 2:
        return None
    samplings = [r.req.sampling for r in batch]
    tokens, hashes, k = draw_runs(sched.space, [r.h for r in batch], [sched.salt_for(r.salt_seed) for r in batch],
                                  [len(r.handle.output_ids) for r in batch], [not sp.ignore_eos for sp in samplings],
                                  [sp.min_new_tokens for sp in samplings], [sp.stop_token_ids for sp in samplings],
                                  k - 1)
    if k < 2:
        return None
    return DecodeStretch(batch=list(batch), tokens=tokens, hashes=hashes, ends=ends[:k], durations=durations[:k],
                         context_tokens=ctx)


def commit(st: DecodeStretch, n: int, sched: Scheduler, stats: Stats) -> None:
    """Apply the next ``n`` bulk iterations of ``st``: their tokens, stats and the KV that
    planning each following iteration reserves (no callback is due in them)."""
    if n <= 0:
        return
    lo, hi = st.done, st.done + n
    version, space = sched.version, sched.space
    first_end = st.ends[lo]
    for r, toks, hs in zip(st.batch, st.tokens, st.hashes):
        h = r.handle
        out = h.output_ids
        n_out = len(out)
        if r.req.return_logprob:
            salt = sched.salt_for(r.salt_seed)
            for before in [r.h, *hs[lo:hi - 1]]:  # each token's logprob is of the context before it
                h.output_logprobs.append(space.logprob(before, salt))
        r.h = hs[hi - 1]
        out.extend(toks[lo:hi])
        spans = h.weight_versions
        if spans and spans[-1][0] == version:
            spans[-1][2] += n
        else:
            spans.append([version, n_out, n_out + n])
        if h.first_token_time is None:
            h.first_token_time = first_end
        if h.progress_every and n_out + n >= h.progress_next:  # its last mark in the stretch
            every = h.progress_every
            sched.mark_progress(h, h.progress_next + (n_out + n - h.progress_next) // every * every)
        r.private += n
    _reserve_next(sched, n, len(st.batch))
    stats.record_decode_run(st.ends[lo:hi], st.durations[lo:hi], len(st.batch))
    st.done = hi


def _reserve_next(sched: Scheduler, n: int, b: int) -> None:
    """The KV of the ``n`` iterations planned after those committed, a token per request
    each. Stepping's plan of each evicts its shortfall from the prefix cache first
    (``Scheduler._ensure_decode_room``: least recent whole pages), which adds up to
    evicting the whole shortfall at once."""
    short = n * b - sched.free_tokens()
    if short > 0:
        sched.cache.evict(short)
    sched.private_total += n * b
