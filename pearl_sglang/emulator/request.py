"""Typed requests, finish reasons and the live handle of one request.

These are the domain types at the edge of the engine: the HTTP shell turns JSON into a
``GenerateRequest`` and reads results from a ``RequestHandle``; an in-process benchmark
does the same without JSON.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Optional

from .prompt_ids import PromptIds


class DisaggregationMode(str, enum.Enum):
    """SGLang's ``--disaggregation-mode`` of one engine (not PEARL's view of a worker,
    ``core.state.Role``, which also knows training and colocated workers)."""

    NULL = "null"  # colocated
    PREFILL = "prefill"
    DECODE = "decode"


class EngineError(Exception):
    """Base class for engine refusals."""


class RequestRejected(EngineError):
    """A request the server refuses up front (HTTP status in ``status``)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


FAKE_BOOTSTRAP_HOST = "2.2.2.2"


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stream_interval: Optional[int] = None
    sampling_seed: Optional[int] = None
    no_stop_trim: bool = False
    skip_special_tokens: bool = True


@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: Optional[int]
    room: Optional[int]

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST


@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    input_ids: "tuple[int, ...] | PromptIds"
    sampling: SamplingParams = SamplingParams()
    bootstrap: Optional[Bootstrap] = None
    return_logprob: bool = False
    return_prompt_token_ids: bool = False
    priority: Optional[int] = None


@dataclass(frozen=True)
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: "int | str | None" = None
    length: Optional[int] = None
    message: Optional[str] = None
    status_code: Optional[int] = None
    err_type: Optional[str] = None

    def to_json(self) -> dict:
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message,
                "status_code": self.status_code, "err_type": self.err_type}

    @staticmethod
    def aborted(message: str = "Aborted", status_code: Optional[int] = None,
                err_type: Optional[str] = None) -> "FinishReason":
        return FinishReason("abort", message=message, status_code=status_code,
                            err_type=err_type)


class Stage(str, enum.Enum):
    HELD = "held"                  # blocked before the scheduler (paused / weight update)
    BOOTSTRAP = "bootstrap"        # PD prefill: waiting for its decode to connect
    PREALLOC = "prealloc"          # PD decode: waiting for KV space
    AWAIT_KV = "await_kv"          # PD decode: registered, KV in flight
    WAITING = "waiting"            # queued for (re-)prefill
    PREFILLING = "prefilling"      # chunked prefill in progress
    RUNNING = "running"            # decoding
    TRANSFER = "transfer"          # PD prefill: KV being sent
    FINISHED = "finished"


@dataclass(eq=False)
class RequestHandle:
    """Live view of one request; the engine updates it, callers only read it.

    ``weight_versions`` holds ``[version, start, end)`` spans over output positions.
    Times are engine (emulated) seconds.  ``on_update`` is due for every new token from
    ``notify_at`` output tokens on (and on finish); the engine may skip the calls before,
    so a caller that wakes every n tokens raises it by n after each wake-up.
    """

    rid: str
    prompt_tokens: int
    arrival_time: float
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: Optional[FinishReason] = None
    cached_tokens: int = 0
    num_retractions: int = 0
    weight_versions: list[list] = field(default_factory=list)
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None
    stage: Stage = Stage.WAITING
    on_update: Optional[Callable[["RequestHandle"], None]] = None
    notify_at: int = 0
    on_finish: Optional[Callable[["RequestHandle"], None]] = None
    # Progress kept by the engine instead of waking a caller (``progress_every`` > 0): from
    # ``progress_next`` output tokens on, every ``progress_every`` tokens, ``progress`` is
    # what a stream chunk read at that instant would have reported.
    progress_every: int = 0
    progress_next: int = 0
    progress: Optional["Progress"] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def weight_version(self) -> Optional[str]:
        return self.weight_versions[-1][0] if self.weight_versions else None

    @property
    def e2e_latency(self) -> Optional[float]:
        if self.finish_time is None:
            return None
        return self.finish_time - self.arrival_time


@dataclass(frozen=True)
class Progress:
    """A request's state as a stream chunk of its first ``completion_tokens`` would show it."""

    completion_tokens: int
    cached_tokens: int
    weight_version: str
    num_retractions: int

    @classmethod
    def now(cls, h: "RequestHandle", engine_version: str) -> "Progress":
        return cls(len(h.output_ids), h.cached_tokens, h.weight_version or engine_version, h.num_retractions)


@dataclass(frozen=True)
class OpResult:
    """Outcome of a control operation (weight update, release, role switch...)."""

    success: bool
    message: str
    extra: tuple[tuple[str, object], ...] = ()

    def as_dict(self) -> dict:
        return dict(self.extra)


@dataclass(frozen=True)
class KVPayload:
    """What a prefill hands its decode with the KV: the first token and accounting."""

    first_token: int
    first_logprob: float
    weight_version: str
    prompt_tokens: int
    cached_tokens: int
