"""Iteration-level scheduling of one emulated worker: the model of its GPUs.

Continuous batching as in SGLang: each iteration is either a prefill batch (chunks of
waiting requests within a token budget; new prefills take priority over decode, which
is how prefill interrupts decode under colocation) or a decode step of every running
request; with ``mixed`` (SGLang ``--enable-mixed-chunk``) one iteration carries both.
KV lives in a pool of ``capacity`` tokens shared with the prefix cache; admission
reserves room for expected output (``new_token_ratio``) and decode retracts the most
recently admitted requests when the pool runs dry.

Pure apart from callbacks: time is an argument, costs come from ``profile.CostModel``.
Invariants (tested): ``used() <= capacity``; every token a request holds is counted once,
in its private KV or in a locked cache page.
"""
from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from .prefix_cache import PrefixCache
from .profile import CostModel
from .request import FinishReason, GenerateRequest, Progress, RequestHandle, Stage
from .tokens import BASE, MASK, TokenSpace, draw, extend_block_hashes

CLIP_MAX_NEW_TOKENS = 4096


class Req:
    """Engine-internal state of one request."""

    __slots__ = ("req", "handle", "prompt", "h", "prefilled", "prefill_len", "keys",
                 "locked", "private", "stage", "pd_prefill", "room", "sink", "seq",
                 "timer", "salt_seed", "admitted_once", "prompt_keys", "entered")

    def __init__(self, req: GenerateRequest, handle: RequestHandle, h: int, seq: int) -> None:
        self.req = req
        self.handle = handle
        self.prompt = req.input_ids
        self.h = h                    # hash of prompt + output so far
        self.prefilled = 0
        self.prefill_len = 0
        self.keys: Optional[list[int]] = None  # page keys of the context at admission
        self.prompt_keys: list[int] = []
        self.locked: list[int] = []
        self.private = 0
        self.stage = Stage.WAITING
        self.pd_prefill = False
        self.room: Optional[int] = None
        self.sink = None
        self.seq = seq
        self.timer = None
        self.salt_seed = req.sampling.sampling_seed
        self.admitted_once = False
        self.entered = 0              # when it last entered the waiting queue (an order)

    @property
    def ctx_len(self) -> int:
        return len(self.prompt) + len(self.handle.output_ids)

    def context(self) -> list[int]:
        return list(self.prompt) + self.handle.output_ids

    def context_keys(self, page: int, *, drop_last: bool) -> list[int]:
        """Page keys of prompt + output (without the last token if ``drop_last``)."""
        base = self.keys if self.keys is not None else self.prompt_keys
        start, out = len(base) * page, self.handle.output_ids
        end = len(out) - 1 if drop_last and out else len(out)
        if start >= len(self.prompt):
            tail = out[start - len(self.prompt):end]
        else:
            tail = list(self.prompt[start:]) + out[:end]
        return extend_block_hashes(base, page, tail)

    def reserve(self, ratio: float) -> int:
        left = self.req.sampling.max_new_tokens - len(self.handle.output_ids)
        return int(ratio * min(max(left, 0), CLIP_MAX_NEW_TOKENS))


@dataclass
class Iteration:
    prefill: list[tuple[Req, int]] = field(default_factory=list)
    decode: list[Req] = field(default_factory=list)
    duration: float = 0.0
    context_tokens: int = 0


@dataclass
class Outcome:
    finished: list[tuple[Req, FinishReason]] = field(default_factory=list)
    pd_ready: list[Req] = field(default_factory=list)
    updated: list[Req] = field(default_factory=list)
    tokens: int = 0


class Scheduler:
    def __init__(self, *, cost: CostModel, space: TokenSpace, cache: PrefixCache,
                 capacity: int, chunk_budget: int, max_running: int, mixed: bool,
                 new_token_ratio: float, context_length: int,
                 priority_sign: Optional[int] = None) -> None:
        self.cost = cost
        self.space = space
        self.cache = cache
        self.capacity = capacity
        self.chunk_budget = chunk_budget
        self.max_running = max_running
        self.mixed = mixed
        self.ratio = new_token_ratio
        self.context_length = context_length
        self.priority_sign = priority_sign
        self._entries = 0
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.chunked: Optional[Req] = None
        self.prefilling: list[Req] = []
        self.private_total = 0
        self.retracted_total = 0
        # set by the engine: salt of the current weights for a sampling seed, and label
        self.salt_for: Callable[[Optional[int]], int] = lambda seed: 0
        self.version = "default"
        self.stop_text: Optional[Callable[[list[int]], str]] = None
        self.progressed: list[Req] = []  # reached a progress mark in the iterations just completed

    # ---- KV pool -------------------------------------------------------------
    def free_tokens(self) -> int:
        return self.capacity - self.cache.tokens - self.private_total

    def available(self) -> int:
        return self.free_tokens() + self.cache.evictable_tokens

    def used(self) -> int:
        return self.capacity - self.available()

    def alloc(self, r: Req, n: int) -> bool:
        free = self.free_tokens()
        if free < n:
            free += self.cache.evict(n - free)
            if free < n:
                return False
        self.private_total += n
        r.private += n
        return True

    def release(self, r: Req, *, insert: bool, prompt_only: bool = False) -> None:
        """Give back a request's KV; with ``insert`` its context joins the prefix cache.

        Inserted pages move from the request's private KV into the cache, so the pool
        total is unchanged for them; the rest is freed.
        """
        if insert and self.cache.enabled:
            keys = r.prompt_keys if prompt_only else r.context_keys(self.cache.page, drop_last=True)
            self.cache.insert(keys)
        self.private_total -= r.private
        self.cache.unlock(r.locked)
        r.locked, r.private = [], 0
        if self.free_tokens() < 0:
            self.cache.evict(-self.free_tokens())

    def enqueue(self, r: Req, *, front: bool = False) -> None:
        self._entries += 1
        r.entered = self._entries
        if front:
            self.waiting.appendleft(r)
        else:
            self.waiting.append(r)

    def _order_waiting(self) -> None:
        """SGLang's FCFS with priority scheduling: by priority (a missing one counts as the
        last), then by when the request entered the queue. Running requests are never
        preempted here (SGLang preempts only for a priority difference over its threshold,
        10 by default)."""
        sign = self.priority_sign
        if sign is None or len(self.waiting) < 2:
            return
        last = sys.maxsize if sign == 1 else -sys.maxsize - 1
        ordered = sorted(self.waiting, key=lambda r: ((r.req.priority if r.req.priority is not None
                                                       else last) * sign, r.entered))
        self.waiting.clear()
        self.waiting.extend(ordered)

    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.prefilling)

    # ---- planning ------------------------------------------------------------
    def plan(self, *, allow_prefill: bool) -> Optional[Iteration]:
        it = Iteration()
        if allow_prefill and (self.waiting or self.chunked):
            self._plan_prefill(it)
        if it.prefill and not self.mixed:
            it.duration = self.cost.prefill_fixed_s + self._prefill_cost(it)
            return it
        if self.running:
            self._ensure_decode_room()
            it.decode = list(self.running)
            ctx = 0
            for r in it.decode:
                ctx += len(r.prompt) + len(r.handle.output_ids)
                r.private += 1
            self.private_total += len(it.decode)
            it.context_tokens = ctx
        if not it.prefill and not it.decode:
            return None
        it.duration = self.cost.decode_s(len(it.decode), it.context_tokens)
        if it.prefill:
            it.duration += self._prefill_cost(it) + (0.0 if it.decode else self.cost.prefill_fixed_s)
        return it

    def _prefill_cost(self, it: Iteration) -> float:
        return sum(self.cost.prefill_tokens_s(n, r.prefilled) for r, n in it.prefill)

    def _plan_prefill(self, it: Iteration) -> None:
        budget = self.chunk_budget
        if self.chunked is not None:
            r = self.chunked
            n = min(budget, r.prefill_len - r.prefilled)
            it.prefill.append((r, n))
            budget -= n
            if r.prefilled + n < r.prefill_len:
                return
            self.chunked = None
        active = len(self.running) + len(self.prefilling)
        avail = self.available() - sum(r.reserve(self.ratio) for r in self.running)
        page = self.cache.page
        self._order_waiting()
        while self.waiting and budget > 0 and active < self.max_running:
            r = self.waiting[0]
            ctx_len = r.ctx_len
            if r.keys is None:
                r.keys = r.context_keys(page, drop_last=False)
            matched = self.cache.match(r.keys, ctx_len - 1)
            cached = matched * page
            extend = ctx_len - cached
            need = extend + r.reserve(self.ratio)
            if need > avail and (self.running or self.prefilling or it.prefill):
                break
            locked = r.keys[:matched]
            self.cache.lock(locked)
            if not self.alloc(r, extend):
                self.cache.unlock(locked)
                break
            self.waiting.popleft()
            r.locked = locked
            if not r.admitted_once:
                r.handle.cached_tokens = cached
                r.admitted_once = True
            self.cache.record(cached, ctx_len)
            r.prefilled, r.prefill_len = cached, ctx_len
            r.stage = r.handle.stage = Stage.PREFILLING
            self.prefilling.append(r)
            avail -= need
            active += 1
            n = min(budget, extend)
            it.prefill.append((r, n))
            budget -= n
            if n < extend:
                self.chunked = r
                break

    def _ensure_decode_room(self) -> None:
        if self.free_tokens() >= len(self.running):  # the common case: room without eviction
            return
        while self.running and self.available() < len(self.running):
            if len(self.running) == 1:
                break
            self.retract(self.running[-1])
        if self.free_tokens() < len(self.running):
            self.cache.evict(len(self.running) - self.free_tokens())

    def retract(self, r: Req) -> None:
        """Send a running request back to the queue, dropping its KV (re-prefilled later)."""
        if r in self.running:
            self.running.remove(r)
        elif r in self.prefilling:
            self.prefilling.remove(r)
            if self.chunked is r:
                self.chunked = None
        self.release(r, insert=False)
        r.keys = None
        r.stage = r.handle.stage = Stage.WAITING
        r.handle.num_retractions += 1
        self.retracted_total += 1
        self.enqueue(r, front=True)

    def detach(self, r: Req) -> None:
        """Take a request out of every scheduler queue, keeping its KV accounted."""
        if r.stage == Stage.RUNNING:
            if r in self.running:
                self.running.remove(r)
        elif r.stage == Stage.PREFILLING:
            if r in self.prefilling:
                self.prefilling.remove(r)
            if self.chunked is r:
                self.chunked = None
        elif r.stage == Stage.WAITING and r in self.waiting:
            self.waiting.remove(r)

    # ---- completing an iteration -------------------------------------------
    def complete(self, it: Iteration, t: float) -> Outcome:
        out = Outcome()
        for r, n in it.prefill:
            if r.stage != Stage.PREFILLING:
                continue
            r.prefilled += n
            if r.prefilled < r.prefill_len:
                continue
            self.prefilling.remove(r)
            if r.pd_prefill:
                self.emit(r, t, out, check=False)
                r.stage = r.handle.stage = Stage.TRANSFER
                out.pd_ready.append(r)
                continue
            r.stage = r.handle.stage = Stage.RUNNING
            self.running.append(r)
            self.emit(r, t, out)
        for r in it.decode:
            if r.stage == Stage.RUNNING:
                self.emit(r, t, out)
        return out

    def emit(self, r: Req, t: float, out: Outcome, *, check: bool = True) -> None:
        """Generate one token for ``r`` from its context hash and the current weights."""
        h, handle, sp = r.h, r.handle, r.req.sampling
        salt = self.salt_for(r.salt_seed)
        n_out = len(handle.output_ids)
        space = self.space
        tok = draw(space, sp, h, salt, n_out)
        handle.output_ids.append(tok)
        if r.req.return_logprob:
            handle.output_logprobs.append(space.logprob(h, salt))
        r.h = (h * BASE + tok + 1) & MASK
        spans = handle.weight_versions
        if spans and spans[-1][0] == self.version:
            spans[-1][2] += 1
        else:
            spans.append([self.version, n_out, n_out + 1])
        if handle.first_token_time is None:
            handle.first_token_time = t
        out.tokens += 1
        out.updated.append(r)
        if handle.progress_every and n_out + 1 >= handle.progress_next:
            self.progressed.append(r)
        if check:
            reason = self.finish_reason(r, tok)
            if reason is not None:
                out.finished.append((r, reason))

    def mark_progress(self, h: RequestHandle, tokens: int) -> None:
        """``h``'s progress at ``tokens`` output tokens, as a stream chunk read now shows it."""
        h.progress = replace(Progress.now(h, self.version), completion_tokens=tokens)
        h.progress_next = tokens + h.progress_every

    def record_progress(self) -> None:
        """Progress of the requests that reached their mark, read where a caller woken by
        the iteration would read it: once the engine has planned on from that instant."""
        for r in self.progressed:
            if r.handle.finish_reason is None:  # a finished one's stream ends with its final chunk
                self.mark_progress(r.handle, len(r.handle.output_ids))
        self.progressed.clear()

    def finish_reason(self, r: Req, tok: int) -> Optional[FinishReason]:
        sp, n = r.req.sampling, len(r.handle.output_ids)
        ctx_len = len(r.prompt) + n
        if n > sp.min_new_tokens:
            if tok == self.space.eos_token_id and not sp.ignore_eos:
                return FinishReason("stop", matched=tok)
            if tok in sp.stop_token_ids:
                return FinishReason("stop", matched=tok)
            if sp.stop and self.stop_text is not None:
                text = self.stop_text(r.handle.output_ids)
                for s in sp.stop:
                    if s and s in text:
                        return FinishReason("stop", matched=s)
        if n >= sp.max_new_tokens:
            return FinishReason("length", length=sp.max_new_tokens)
        if ctx_len >= self.context_length or ctx_len >= self.capacity - 1:
            return FinishReason("length", length=n)
        return None
