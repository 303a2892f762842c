"""The emulated worker as a discrete-event model, advanced by an injected clock.

``Engine`` owns one worker's timeline: the iteration in progress (from ``Scheduler``),
control operations (weight updates, release/resume, role switch: ``control.py``), KV
transfers on its outgoing link, and PD rendezvous timeouts.  It has no asyncio and
never sleeps: every public call first brings the model up to ``clock.now()``, then acts
at that instant.  A driver asks ``next_event_time()``, moves the clock there and calls
``advance()``; the HTTP shell does that in scaled real time, a benchmark on a
``ManualClock`` (``benchmarks.harness.virtual_cluster``).  Events are processed at their
own model time even when the driver is late, so results do not depend on the driver's
timing.

Calls that arrive while the engine is itself running an event (PD callbacks between
engines in one process) are queued and applied at the same model time.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from ..clock import Clock
from .control import ControlMixin, Op
from .pd_side import PDMixin
from .prefix_cache import PrefixCache
from .profile import PerformanceModel
from .request import DisaggregationMode, FinishReason, GenerateRequest, RequestHandle, RequestRejected, Stage
from .pd import KVSink, Rendezvous
from .scheduler import Iteration, Req, Scheduler
from .stats import Stats
from .stretch import DecodeStretch, commit, plan_stretch
from .tokens import GARBAGE_WEIGHTS, TokenSpace, prompt_hashes, version_salt
from .transfer import SharedLink


@dataclass(frozen=True)
class EngineConfig:
    role: DisaggregationMode = DisaggregationMode.NULL
    model_path: str = "emulated-model"
    weight_version: str = "default"
    max_total_tokens: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    max_running_requests: Optional[int] = None
    prefix_cache: bool = True
    mixed_chunk: bool = False
    memory_saver: bool = False
    weights_cpu_backup: bool = False
    pd_role_switch: bool = False
    transfer_backend: str = "mooncake"
    bootstrap_host: str = "127.0.0.1"
    bootstrap_port: int = 8998
    pd_timeout_s: float = 300.0
    vocab_size: Optional[int] = None
    eos_token_id: Optional[int] = None
    special_ids: frozenset[int] = frozenset()
    context_length: Optional[int] = None
    seed: int = 0
    token_low: int = 0  # lowest id the model emits (the byte codec reserves 0-258)
    # Runs of decode iterations in which nothing can change are one event (``stretch``);
    # False steps iteration by iteration (the same results, slower).
    decode_stretches: bool = True
    # SGLang's --enable-priority-scheduling: -1 serves higher priority values first (its
    # default), 1 lower first (--schedule-low-priority-values-first); None: arrival order.
    priority_sign: Optional[int] = None

    def validate(self) -> None:
        if self.pd_timeout_s <= 0:
            raise ValueError("pd_timeout_s must be positive")
        for name in ("max_total_tokens", "chunked_prefill_size", "max_running_requests"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be positive")


class Engine(ControlMixin, PDMixin):
    def __init__(self, *, profile: PerformanceModel, clock: Clock, config: EngineConfig = EngineConfig(),
                 rendezvous: Optional[Rendezvous] = None,
                 stop_text: Optional[Callable[[list[int]], str]] = None) -> None:
        config.validate()
        self.profile, self.config, self.clock, self.rendezvous = profile, config, clock, rendezvous
        self.space = TokenSpace(
            vocab_size=config.vocab_size or profile.vocab_size,
            eos_token_id=profile.eos_token_id if config.eos_token_id is None else config.eos_token_id,
            special_ids=config.special_ids, eos_probability=profile.eos_probability,
            low=config.token_low)
        capacity = config.max_total_tokens or profile.max_total_tokens
        self.context_length = config.context_length or profile.context_length
        self.sched = Scheduler(
            cost=profile.cost, space=self.space,
            cache=PrefixCache(page=profile.cache_page_tokens, enabled=config.prefix_cache),
            capacity=capacity,
            chunk_budget=min(config.chunked_prefill_size or profile.chunked_prefill_size,
                             profile.max_prefill_tokens),
            max_running=config.max_running_requests or profile.max_running_requests,
            mixed=config.mixed_chunk, new_token_ratio=profile.new_token_ratio,
            context_length=self.context_length, priority_sign=config.priority_sign)
        self.sched.salt_for = self._salt_for
        self.sched.stop_text = stop_text
        self.role = config.role
        self.model_path = config.model_path
        self.sched.version = self.version = config.weight_version
        self._weights_valid = True
        self._salts: dict[tuple[str, Optional[int]], int] = {}
        self._reqs: dict[str, Req] = {}
        self._held: list[Req] = []
        self._paused: Optional[str] = None
        self._released: set[str] = set()
        self._writer_waiting = 0
        self._ops: deque[Op] = deque()
        self._current: "Iteration | DecodeStretch | Op | None" = None
        self._busy_until: Optional[float] = None
        self._t = clock.now()
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, Req]] = []
        self._inbox: deque[Callable[[], None]] = deque()
        self._in_progress = False
        self.on_wake: Optional[Callable[[], None]] = None
        self.link = SharedLink(bandwidth=profile.kv_bandwidth_bytes_per_s, latency_s=profile.kv_latency_s)
        self._transfers: dict[str, Req] = {}
        self._bootstrap: dict[int, Req] = {}
        self._sinks: dict[int, KVSink] = {}
        self._prealloc: deque[Req] = deque()
        self._await_kv: dict[str, Req] = {}
        self._decode_graphs = config.role == DisaggregationMode.DECODE
        self.stats = Stats()
        self._bound = False
        self._rebind()

    # ---- driving -------------------------------------------------------------
    def next_event_time(self) -> Optional[float]:
        best = self._busy_until
        other = self._next_other_event()
        if other is not None and (best is None or other < best):
            best = other
        return best

    def _next_other_event(self) -> Optional[float]:
        """The next KV transfer completion or timer (events besides the current work)."""
        best = self.link.next_completion()
        timers = self._timers
        while timers and timers[0][2].timer != timers[0][1]:
            heapq.heappop(timers)
        if timers and (best is None or timers[0][0] < best):
            best = timers[0][0]
        return best

    def advance(self, until: Optional[float] = None) -> None:
        """Process every event up to ``clock.now()`` (or ``until`` if later: a driver that
        moved the clock to an event's time, up to float rounding)."""
        if self._in_progress:
            return
        self._in_progress = True
        try:
            target = self.clock.now()
            if until is not None and until > target:
                target = until
            self._settle(self._t)
            while True:
                nxt = self.next_event_time()
                if nxt is None or nxt > target:
                    break
                if nxt > self._t:
                    self._t = nxt
                self._process(self._t)
                self._settle(self._t)
            if target > self._t:
                self._t = target
                self._catch_up(target)
                if self._busy_until is None or self._inbox:
                    self._settle(target)
        finally:
            self._in_progress = False

    @property
    def now(self) -> float:
        return self._t

    def _external(self, fn: Callable[[], None]) -> None:
        if self._in_progress:
            self._inbox.append(fn)
            return
        self.advance()
        self._cut_stretch()
        self._in_progress = True
        try:
            fn()
            self._settle(self._t)
        finally:
            self._in_progress = False
        if self.on_wake is not None:
            self.on_wake()

    def _settle(self, t: float) -> None:
        while True:
            if self._inbox:
                self._catch_up(t)
                self._cut_stretch()
            while self._inbox:
                self._inbox.popleft()()
            self._kick(t)
            if not self._inbox:
                if self.sched.progressed:
                    self.sched.record_progress()
                return

    def _kick(self, t: float) -> None:
        if self._busy_until is not None:
            return
        if self._ops and self._ops[0].ready():
            op = self._ops.popleft()
            self._current, self._busy_until = op, t + op.duration
            return
        if self._paused is not None or self._released:
            return
        if self._prealloc:
            self._admit_prealloc(t)
        it = self.sched.plan(allow_prefill=True)
        if it is None:
            return
        if self.config.decode_stretches and not it.prefill and not self._ops and self._batch_is_fixed():
            st = plan_stretch(self.sched, it, t, self._next_other_event())
            if st is not None:
                self._current, self._busy_until = st, st.end
                return
        self._current, self._busy_until = it, t + it.duration

    # ---- decode stretches (``stretch.py``) ---------------------------------------
    def _batch_is_fixed(self) -> bool:
        """Whether planning the next iterations can only repeat this decode batch: nothing
        is being prefilled, and the waiting queue cannot be admitted before a request ends."""
        s = self.sched
        if s.chunked is not None or s.prefilling or self._prealloc:
            return False
        return not s.waiting or len(s.running) >= s.max_running

    def _catch_up(self, t: float) -> None:
        """Apply the stretch's iterations that ended by ``t`` (someone is about to look)."""
        st = self._current
        if isinstance(st, DecodeStretch):
            commit(st, st.due(t), self.sched, self.stats)

    def _cut_stretch(self) -> None:
        """Something outside is about to change the engine: the stretch ends with the
        iteration in progress."""
        st = self._current
        if isinstance(st, DecodeStretch):
            self._current, self._busy_until = st.in_progress(), st.ends[st.done]

    def _process(self, t: float) -> None:
        if self._busy_until is not None and self._busy_until <= t:
            cur, self._current, self._busy_until = self._current, None, None
            if isinstance(cur, DecodeStretch):
                commit(cur, len(cur.ends) - 1 - cur.done, self.sched, self.stats)
                cur = cur.in_progress()
            if isinstance(cur, Iteration):
                self._complete_iteration(cur, t)
            else:
                self._complete_op(cur)
        for rid in self.link.pop_completed(t):
            self._transfer_done(rid, t)
        timers = self._timers
        while timers and timers[0][0] <= t:
            _, seq, r = heapq.heappop(timers)
            if r.timer == seq:
                r.timer = None
                self._timeout(r, t)

    def _complete_iteration(self, it: Iteration, t: float) -> None:
        out = self.sched.complete(it, t)
        self.stats.iteration(t, it, out.tokens)
        done = set()
        for r, reason in out.finished:
            done.add(r.req.rid)
            self._finish(r, reason, t)
        for r in out.pd_ready:
            self._start_transfer(r, t)
        for r in out.updated:
            cb = r.handle.on_update
            if cb is not None and r.req.rid not in done:
                cb(r.handle)

    # ---- requests --------------------------------------------------------------
    def submit(self, req: GenerateRequest, *,
               on_update: Optional[Callable[[RequestHandle], None]] = None,
               on_finish: Optional[Callable[[RequestHandle], None]] = None) -> RequestHandle:
        """Queue a request; raises ``RequestRejected`` for what SGLang refuses up front."""
        self.advance()
        self._validate(req)
        handle = RequestHandle(rid=req.rid, prompt_tokens=len(req.input_ids),
                               arrival_time=self._t, on_update=on_update, on_finish=on_finish)
        keys, h = prompt_hashes(req.input_ids, self.sched.cache.page)
        r = Req(req, handle, h, next(self._seq))
        r.keys = r.prompt_keys = keys
        self._reqs[req.rid] = r
        self.stats.prompt_tokens += len(req.input_ids)

        def enter() -> None:
            if self._paused is not None or self._writer_waiting:
                r.stage = handle.stage = Stage.HELD
                self._held.append(r)
            else:
                self._admit(r)
        self._external(enter)
        return handle

    def _validate(self, req: GenerateRequest) -> None:
        if self._released:
            raise RequestRejected("emulator: memory is released ("
                                  + ",".join(sorted(self._released)) + "); resume it first", 503)
        if req.rid in self._reqs:
            raise RequestRejected(f"Duplicate request ID: {req.rid}")
        n, m = len(req.input_ids), req.sampling.max_new_tokens
        if n == 0:
            raise RequestRejected("The input_ids is empty.")
        if n + m >= self.context_length:
            raise RequestRejected(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of {n + m} tokens: {n} "
                f"tokens from the input messages and {m} tokens for the completion. Please "
                f"reduce the number of tokens in the input messages or the completion to fit "
                f"within the limit.")
        if n >= self.sched.capacity - 1:
            raise RequestRejected(f"input of {n} tokens exceeds the KV capacity "
                                  f"({self.sched.capacity} tokens)")
        if self.role != DisaggregationMode.NULL and self.config.transfer_backend != "fake":
            b = req.bootstrap
            if b is None or (b.room is None and not b.fake):
                raise RequestRejected("Disaggregated request received without bootstrap room id")

    def _admit(self, r: Req) -> None:
        b = r.req.bootstrap
        if self.role == DisaggregationMode.NULL:
            self._to_waiting(r)
        elif self.role == DisaggregationMode.PREFILL:
            r.pd_prefill = True
            r.room = b.room if b is not None else None
            if b is None or b.fake or r.room in self._sinks:
                self._to_waiting(r)
            else:
                r.stage = r.handle.stage = Stage.BOOTSTRAP
                self._bootstrap[r.room] = r
                self._set_timer(r)
        else:
            r.room = b.room if b is not None else None
            r.stage = r.handle.stage = Stage.PREALLOC
            self._prealloc.append(r)

    def _to_waiting(self, r: Req) -> None:
        r.stage = r.handle.stage = Stage.WAITING
        self.sched.enqueue(r)

    def _set_timer(self, r: Req) -> None:
        r.timer = next(self._seq)
        heapq.heappush(self._timers, (self._t + self.config.pd_timeout_s, r.timer, r))

    def _finish(self, r: Req, reason: FinishReason, t: float) -> None:
        h = r.handle
        if r.stage in (Stage.RUNNING, Stage.PREFILLING, Stage.WAITING):
            self.sched.detach(r)
        insert = reason.type != "abort" and self.role != DisaggregationMode.DECODE and r.stage != Stage.AWAIT_KV
        self.sched.release(r, insert=insert, prompt_only=r.pd_prefill)
        r.timer = None
        r.stage = h.stage = Stage.FINISHED
        h.finish_reason, h.finish_time = reason, t
        self._reqs.pop(r.req.rid, None)
        self.stats.finished(h)
        if h.on_finish is not None:
            h.on_finish(h)

    def abort(self, rid: Optional[str] = None, *, abort_all: bool = False,
              message: str = "Aborted", status_code: Optional[int] = None) -> int:
        """Abort requests whose rid starts with ``rid`` (or all); partial output is kept.

        As in SGLang 0.5.23 with one tokenizer worker, the abort is only dispatched when a
        request with exactly ``rid`` exists; the scheduler then matches by prefix."""
        hits: list[Req] = []

        def run() -> None:
            if not abort_all and rid not in self._reqs:
                return
            hits.extend(r for k, r in list(self._reqs.items())
                        if abort_all or (rid is not None and k.startswith(rid)))
            for r in hits:
                self._abort(r, message, status_code)
        self._external(run)
        return len(hits)

    def _abort(self, r: Req, message: str = "Aborted", status_code: Optional[int] = None,
               err_type: Optional[str] = None) -> None:
        st = r.stage
        if st == Stage.FINISHED:
            return
        if message == "Aborted" and st in (Stage.HELD, Stage.WAITING, Stage.BOOTSTRAP, Stage.PREALLOC):
            message = "Abort in waiting queue"
        if st == Stage.HELD:
            self._held.remove(r)
        elif st == Stage.BOOTSTRAP:
            self._bootstrap.pop(r.room, None)
        elif st == Stage.PREALLOC:
            self._prealloc.remove(r)
        elif st == Stage.AWAIT_KV:
            if message == "Aborted":
                # SGLang fails the decode's KV receive on an abort and reports that failure.
                message, status_code = (
                    f"Decode transfer failed for request rank=0 decode_req.req.rid={r.req.rid!r} "
                    f"decode_req.req.bootstrap_room={r.room} with exception "
                    f"KVTransferError(bootstrap_room={r.room}): Aborted by AbortReq.", 500)
            self._await_kv.pop(r.req.rid, None)
            b = r.req.bootstrap
            if self.rendezvous is not None and b is not None and not b.fake:
                self.rendezvous.cancel(b.host, b.port or self.config.bootstrap_port, r.room)
        elif st == Stage.TRANSFER:
            self.link.remove(r.req.rid, self._t)
            self._transfers.pop(r.req.rid, None)
            sink = self._sinks.pop(r.room, None)
            if sink is not None:
                sink.kv_failed("prefill request aborted")
        self._finish(r, FinishReason.aborted(message, status_code, err_type), self._t)

    def _timeout(self, r: Req, t: float) -> None:
        what = "bootstrap" if r.stage == Stage.BOOTSTRAP else "KV transfer"
        self._abort(r, f"Request timed out waiting for {what}", 503, "ServiceUnavailable")

    # ---- weights -----------------------------------------------------------------
    def _salt_for(self, seed: Optional[int]) -> int:
        key = (self.version if self._weights_valid else GARBAGE_WEIGHTS, seed)
        salt = self._salts.get(key)
        if salt is None:
            model = f"{self.config.seed}:{key[0]}" if self.config.seed else key[0]
            salt = self._salts[key] = version_salt(model, seed)
        return salt

    def _set_version(self, version: str) -> None:
        self.sched.version = self.version = version

    def _rebind(self) -> None:
        rv, c = self.rendezvous, self.config
        want = rv is not None and self.role != DisaggregationMode.NULL and (
            self.role == DisaggregationMode.PREFILL or c.pd_role_switch)
        if want and not self._bound:
            rv.bind(c.bootstrap_host, c.bootstrap_port, self)
        elif not want and self._bound and rv is not None:
            rv.unbind(c.bootstrap_host, c.bootstrap_port, self)
        self._bound = want
