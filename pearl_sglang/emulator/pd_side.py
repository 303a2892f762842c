"""The PD half of an engine: a prefill's bootstrap queue and KV sends, a decode's
preallocation and KV receipt.  Mixed into ``Engine``; runs on its timeline.

Prefill: a request waits in the bootstrap queue until its decode connects (as SGLang's
``PrefillBootstrapQueue``), is prefilled, then its KV goes out over the shared link; when
the transfer ends the prefill answers with one token and ``length`` 0 and the decode
receives the first token.  Decode: a request waits for KV space (prealloc queue),
connects to the prefill through the ``Rendezvous``, and starts decoding on receipt.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .request import FinishReason, KVPayload, DisaggregationMode, Stage
from .scheduler import Req
from .tokens import extend_hash, fake_first_token

if TYPE_CHECKING:
    from .engine import Engine
    from .pd import KVSink


class _DecodeSink:
    __slots__ = ("engine", "r")

    def __init__(self, engine: "Engine", r: Req) -> None:
        self.engine, self.r = engine, r

    def kv_ready(self, payload: KVPayload) -> None:
        self.engine._external(lambda: self.engine._on_kv_ready(self.r, payload))

    def kv_failed(self, message: str) -> None:
        self.engine._external(lambda: self.engine._on_kv_failed(self.r, message))


class PDMixin:
    # ---- PD: prefill side ------------------------------------------------------
    def accept_decode(self: "Engine", room: int, sink: KVSink) -> None:
        """A decode connected for ``room`` (called by the rendezvous)."""
        def run() -> None:
            if self.role != DisaggregationMode.PREFILL:
                sink.kv_failed(f"bootstrap server of a {self.role.value} instance has no KV")
                return
            self._sinks[room] = sink
            r = self._bootstrap.pop(room, None)
            if r is not None:
                r.timer = None
                self._to_waiting(r)
        self._external(run)

    def cancel_decode(self: "Engine", room: int) -> None:
        self._external(lambda: self._sinks.pop(room, None))

    def _start_transfer(self: "Engine", r: Req, t: float) -> None:
        b = r.req.bootstrap
        if b is None or b.fake:
            self._finish(r, FinishReason("length", length=0), t)
            return
        self._transfers[r.req.rid] = r
        self.link.add(r.req.rid, len(r.prompt) * self.profile.kv_bytes_per_token, t)

    def _transfer_done(self: "Engine", rid: str, t: float) -> None:
        r = self._transfers.pop(rid, None)
        if r is None or r.stage != Stage.TRANSFER:
            return
        h = r.handle
        payload = KVPayload(first_token=h.output_ids[0],
                            first_logprob=h.output_logprobs[0] if h.output_logprobs else 0.0,
                            weight_version=h.weight_versions[0][0], prompt_tokens=len(r.prompt),
                            cached_tokens=h.cached_tokens)
        self.stats.kv_transfer(len(r.prompt) * self.profile.kv_bytes_per_token)
        sink = self._sinks.pop(r.room, None)
        self._finish(r, FinishReason("length", length=0), t)
        if sink is not None:
            sink.kv_ready(payload)

    # ---- PD: decode side -------------------------------------------------------
    def _admit_prealloc(self: "Engine", t: float) -> None:
        s = self.sched
        while self._prealloc:
            r = self._prealloc[0]
            busy = s.running or self._await_kv or s.waiting
            if busy and s.available() < len(r.prompt) + r.reserve(s.ratio):
                return
            if not s.alloc(r, len(r.prompt)):
                return
            self._prealloc.popleft()
            r.stage = r.handle.stage = Stage.AWAIT_KV
            b = r.req.bootstrap
            if b is None or b.fake or self.config.transfer_backend == "fake":
                tok = fake_first_token(r.req.rid, self.space.vocab_size)
                self._on_kv_ready(r, KVPayload(tok, 0.0, self.version, len(r.prompt), 0))
                continue
            self._await_kv[r.req.rid] = r
            self._set_timer(r)
            port = b.port if b.port is not None else self.config.bootstrap_port
            r.sink = _DecodeSink(self, r)
            if self.rendezvous is None:
                r.sink.kv_failed("no PD rendezvous configured")
            else:
                self.rendezvous.connect(b.host.strip("[]"), port, r.room, r.sink)

    def _on_kv_ready(self: "Engine", r: Req, p: KVPayload) -> None:
        if r.stage != Stage.AWAIT_KV:
            return
        self._await_kv.pop(r.req.rid, None)
        r.timer = None
        h = r.handle
        h.output_ids.append(p.first_token)
        if r.req.return_logprob:
            h.output_logprobs.append(p.first_logprob)
        h.weight_versions.append([p.weight_version, 0, 1])
        h.cached_tokens = p.cached_tokens
        h.first_token_time = self._t
        r.h = extend_hash(r.h, p.first_token)
        r.stage = h.stage = Stage.RUNNING
        self.sched.running.append(r)
        reason = self.sched.finish_reason(r, p.first_token)
        if reason is not None:
            self._finish(r, reason, self._t)
        elif h.on_update is not None:
            h.on_update(h)

    def _on_kv_failed(self: "Engine", r: Req, message: str) -> None:
        if r.stage in (Stage.AWAIT_KV, Stage.PREALLOC):
            self._abort(r, f"KV transfer failed: {message}", 500, "InternalServerError")
