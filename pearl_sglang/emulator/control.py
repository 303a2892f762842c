"""Control operations of an emulated worker, mirroring SGLang 0.5.23's control endpoints.

Each operation either fails at once (with the message SGLang gives) or becomes an ``Op``
that occupies the worker for the profile's duration and then applies its effect and
calls ``on_done``.  Ops run between iterations, like control messages in SGLang's
scheduler loop.  A weight update that is not issued while paused waits for in-flight
requests to drain and holds new ones (SGLang's writer lock).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from .request import OpResult, DisaggregationMode, Stage

if TYPE_CHECKING:
    from .engine import Engine

ALL_TAGS = ("kv_cache", "weights", "cuda_graph")
PAUSE_MODES = ("abort", "retract", "in_place")
Done = Optional[Callable[[OpResult], None]]


@dataclass
class Op:
    kind: str
    duration: float
    apply: Callable[[], OpResult]
    on_done: Done = None
    ready: Callable[[], bool] = field(default=lambda: True)


@dataclass(frozen=True)
class LoadSnapshot:
    timestamp: float
    num_running_reqs: int
    num_waiting_reqs: int
    num_used_tokens: int
    num_total_tokens: int
    max_running_requests: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    utilization: float
    mode: str
    prefill_bootstrap_queue_reqs: int
    prefill_inflight_queue_reqs: int
    decode_prealloc_queue_reqs: int
    decode_transfer_queue_reqs: int
    retracted_reqs: int
    paused_reqs: int
    kv_transfer_speed_gb_s: float


def _ok(message: str, **extra: object) -> OpResult:
    return OpResult(True, message, tuple(extra.items()))


def _fail(message: str, **extra: object) -> OpResult:
    return OpResult(False, message, tuple(extra.items()))


class ControlMixin:
    """Pause/continue, memory release/resume, role switch, weight updates, loads."""

    # ---- state ---------------------------------------------------------------
    @property
    def paused(self: "Engine") -> Optional[str]:
        return self._paused

    @property
    def released_tags(self: "Engine") -> frozenset[str]:
        return frozenset(self._released)

    @property
    def weights_valid(self: "Engine") -> bool:
        return self._weights_valid

    def is_idle(self: "Engine") -> bool:
        """SGLang's ``is_fully_idle``: nothing queued, running or in PD flight."""
        return (self.sched.is_idle() and not self._bootstrap and not self._transfers
                and not self._prealloc and not self._await_kv)

    def _inflight(self: "Engine") -> int:
        return len(self._reqs) - len(self._held)

    def _submit_op(self: "Engine", op: Op) -> None:
        self._external(lambda: self._ops.append(op))

    def _complete_op(self: "Engine", op: Op) -> None:
        result = op.apply()
        if op.on_done is not None:
            op.on_done(result)

    def _immediate(self: "Engine", result: OpResult, on_done: Done) -> OpResult:
        if on_done is not None:
            on_done(result)
        return result

    # ---- pause / continue ----------------------------------------------------
    def pause(self: "Engine", mode: str = "abort") -> None:
        if mode not in PAUSE_MODES:
            raise ValueError(f"invalid pause mode {mode!r}; expected one of {PAUSE_MODES}")

        def run() -> None:
            if mode == "abort":
                for r in [r for r in self._reqs.values() if r.stage != Stage.HELD]:
                    self._abort(r)
            elif mode == "retract":
                for r in list(self.sched.running) + list(self.sched.prefilling):
                    self.sched.retract(r)
            self._paused = mode
        self._external(run)

    def continue_generation(self: "Engine") -> None:
        def run() -> None:
            self._paused = None
            self._release_held()
        self._external(run)

    def _release_held(self: "Engine") -> None:
        if self._paused is not None or self._writer_waiting:
            return
        held, self._held = self._held, []
        for r in held:
            self._admit(r)

    def flush_cache(self: "Engine") -> bool:
        self.advance()
        if not self.is_idle():
            return False
        return self.sched.cache.flush()

    # ---- memory ----------------------------------------------------------------
    def release_memory(self: "Engine", tags: Optional[Iterable[str]] = None, *,
                       on_done: Done = None) -> Optional[OpResult]:
        self.advance()
        tagset = set(tags or ALL_TAGS)
        bad = tagset - set(ALL_TAGS)
        if bad:
            return self._immediate(_fail(f"unknown memory tags: {sorted(bad)}"), on_done)
        if not self.is_idle():
            return self._immediate(_fail(
                "release_memory_occupation requires an idle scheduler; pause and drain first"),
                on_done)
        if not self.config.memory_saver:
            self.sched.cache.flush()
            return self._immediate(_ok("memory saver disabled: nothing released"), on_done)
        again = tagset & self._released
        if again:
            return self._immediate(_fail(f"memory already released for tags {sorted(again)}"),
                                   on_done)

        def apply() -> OpResult:
            self._released |= tagset
            if "kv_cache" in tagset:
                self.sched.cache.flush()
            return _ok("Memory released.")
        self._submit_op(Op("release", self.profile.lifecycle.release_s, apply, on_done))
        return None

    def resume_memory(self: "Engine", tags: Optional[Iterable[str]] = None, *,
                      on_done: Done = None) -> Optional[OpResult]:
        self.advance()
        tagset = set(tags or ALL_TAGS)
        if not self.config.memory_saver:
            return self._immediate(_ok("memory saver disabled: nothing to resume"), on_done)
        missing = tagset - self._released
        if missing:
            return self._immediate(_fail(f"KeyError: {sorted(missing)[0]!r}"), on_done)

        def apply() -> OpResult:
            self._released -= tagset
            if "weights" in tagset and not self.config.weights_cpu_backup:
                self._weights_valid = False
            return _ok("Memory resumed.")
        self._submit_op(Op("resume", self.profile.lifecycle.resume_s, apply, on_done))
        return None

    # ---- PD role switch ------------------------------------------------------------
    def switch_role(self: "Engine", new_role: str, *, decode_cuda_graph_memory_gb: Optional[float] = None,
                    on_done: Done = None) -> Optional[OpResult]:
        self.advance()
        old = self.role.value

        def fail(msg: str, safe: bool = True) -> OpResult:
            return self._immediate(_fail(msg, old_role=old, new_role=new_role,
                                         safe_to_restore=safe), on_done)
        if not self.config.pd_role_switch:
            return fail("PD role switch is disabled; launch with --enable-pd-role-switch")
        if self.config.role == DisaggregationMode.NULL:
            return fail("PD role switch requires a disaggregated (prefill/decode) instance")
        if self.config.transfer_backend not in ("mooncake", "mori"):
            return fail(f"PD role switch is not supported with transfer backend "
                        f"{self.config.transfer_backend}")
        if new_role not in ("prefill", "decode"):
            return fail(f"invalid new_role {new_role!r}; expected 'prefill' or 'decode'")
        if new_role == old:
            return self._immediate(_ok("already in target role", old_role=old, new_role=new_role,
                                       safe_to_restore=True), on_done)
        if not self.is_idle():
            return fail("instance is not idle; drain all requests before switching")
        if new_role == "decode" and not self._decode_graphs and decode_cuda_graph_memory_gb is None:
            return fail("decode_cuda_graph_memory_gb is required before capturing decode graphs")

        def apply() -> OpResult:
            self.role = DisaggregationMode(new_role)
            if new_role == "decode":
                self._decode_graphs = True
            self.sched.cache.flush()
            self._rebind()
            return _ok(f"PD role switched from {old} to {new_role}", old_role=old,
                       new_role=new_role, safe_to_restore=True)
        self._submit_op(Op("role_switch", self.profile.lifecycle.role_switch_s, apply, on_done))
        return None

    # ---- weights -----------------------------------------------------------------------
    def update_weights(self: "Engine", source: str = "disk", *, weight_version: Optional[str] = None,
                       model_path: Optional[str] = None, abort_all_requests: bool = False,
                       flush_cache: bool = True, on_done: Done = None) -> None:
        """Load new weights (``source``: disk | distributed | tensor)."""
        life = self.profile.lifecycle
        duration = {"disk": life.weight_update_disk_s, "distributed": life.weight_update_distributed_s,
                    "tensor": life.weight_update_tensor_s}[source]
        messages = {"disk": "Succeeded to update model weights.",
                    "distributed": "Succeeded to update parameter online from distributed.",
                    "tensor": "Succeeded to update model weights."}
        if abort_all_requests:
            self.abort(abort_all=True)
        self.advance()
        locked = self._paused is None

        def ready() -> bool:
            return not locked or self._inflight() == 0

        def apply() -> OpResult:
            if weight_version is not None:
                self._set_version(weight_version)
            if model_path is not None:
                self.model_path = model_path
            self._weights_valid = True
            if flush_cache:
                self.sched.cache.flush()
            paused = len(self.sched.running) if self._paused else 0
            if locked:
                self._writer_waiting -= 1
                self._release_held()
            return _ok(messages[source], num_paused_requests=paused)

        def enqueue() -> None:
            if locked:
                self._writer_waiting += 1
            self._ops.append(Op(f"update_weights_{source}", duration, apply, on_done, ready))
        self._external(enqueue)

    def update_weight_version(self: "Engine", new_version: str, *, abort_all_requests: bool = True) -> OpResult:
        if abort_all_requests:
            self.abort(abort_all=True)
        self._external(lambda: self._set_version(new_version))
        return _ok(f"Weight version updated to {new_version}", new_version=new_version)

    # ---- loads -----------------------------------------------------------------------------
    def loads(self: "Engine") -> LoadSnapshot:
        self.advance()
        s = self.sched
        used = s.used()
        tput, util = self.stats.window(self._t)
        link_speed = (self.link.bandwidth / len(self.link) / 1e9) if len(self.link) else 0.0
        return LoadSnapshot(
            timestamp=self._t, num_running_reqs=len(s.running) + len(s.prefilling),
            num_waiting_reqs=len(s.waiting), num_used_tokens=used, num_total_tokens=s.capacity,
            max_running_requests=s.max_running, token_usage=used / s.capacity,
            gen_throughput=tput, cache_hit_rate=s.cache.hit_rate, utilization=util,
            mode=self.role.value, prefill_bootstrap_queue_reqs=len(self._bootstrap),
            prefill_inflight_queue_reqs=len(self._transfers),
            decode_prealloc_queue_reqs=len(self._prealloc),
            decode_transfer_queue_reqs=len(self._await_kv),
            retracted_reqs=s.retracted_total, paused_reqs=len(self._held),
            kv_transfer_speed_gb_s=link_speed)
