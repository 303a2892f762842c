"""The admin API as data: what to send for each call and what an answer means.

Both clients (``client.PearlClient`` over urllib, ``aio.AsyncPearlClient`` over
aiohttp) only move bytes; every request they send is a ``Call`` built here and every
answer goes through ``decode``, so the two cannot disagree on bodies, headers, error
classes or which failures are retried. Nothing here does I/O.

Retry rule: a call is retried only if repeating it cannot act twice (a GET, or a POST
carrying a ``request_id``, which the router deduplicates), only after a connection
failure or a 502/503/504, and at most ``len(backoff_s)`` times. A timeout is never
retried here: its outcome is unknown and its time budget is spent.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from pearl_rl_adapter.config import MAX_SECONDS, ClientConfig, is_seconds
from pearl_rl_adapter.errors import (PearlAuthError, PearlConflict, PearlError, PearlProtocolError, PearlRejected,
                                     PearlTimeout, PearlUnavailable)
from pearl_rl_adapter.results import (DistributedWeights, GpusJoined, GpusLeft, TrainBegun, TrainFinished,
                                      WeightGroup, WeightGroupDestroyed, WeightsUpdated, state_from_json)

T = TypeVar("T")
RETRY_STATUSES = frozenset({502, 503, 504})
USER_AGENT = "pearl-rl-adapter/0.1"


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    body: Mapping[str, Any] | None
    timeout_s: float
    parse: Callable[[Mapping[str, Any]], T]
    admin: bool = True

    def __post_init__(self) -> None:
        _seconds(self.timeout_s, "timeout_s")

    @property
    def request_id(self) -> str | None:
        return None if self.body is None else self.body.get("request_id")

    @property
    def idempotent(self) -> bool:
        return self.method == "GET" or self.request_id is not None

    @property
    def endpoint(self) -> str:
        return f"{self.method} {self.path}"


def new_request_id(kind: str) -> str:
    """One id per logical call, reused by every retry of it."""
    return f"{kind}-{uuid.uuid4().hex}"


def _with_id(kind: str, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    body["request_id"] = new_request_id(kind) if request_id is None else _text(request_id, "request_id")
    return body


def _timeout(timeout_s: float | None, default: float) -> float:
    """The call's own timeout (``Call`` checks it), or the config's for its kind."""
    return min(default, MAX_SECONDS) if timeout_s is None else timeout_s


def _port(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"master_port must be an int in 1..65535, got {value!r}")
    return value


def _count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _seconds(value: float, name: str) -> float:
    """A positive, finite number of seconds, else ``ValueError``."""
    if not is_seconds(value):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def _text(value: str, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _step(step: int) -> int:
    return _count(step, "step")


def trajectory_count(count: int) -> int:
    """``count`` as ``train_finished``'s ``remaining_trajectories``, else ``ValueError``."""
    return _count(count, "remaining_trajectories")


# ---- calls ---------------------------------------------------------------------------

def train_begin(cfg: ClientConfig, step: int, *, deadline_s: float | None = None, request_id: str | None = None,
                timeout_s: float | None = None) -> Call[TrainBegun]:
    body: dict[str, Any] = {"step": _step(step)}
    if deadline_s is not None:
        body["deadline_s"] = _seconds(deadline_s, "deadline_s")
    # Wait a little longer than the router's own deadline so its 504 arrives first.
    default = cfg.wait_timeout_s if deadline_s is None else body["deadline_s"] + cfg.timeout_s
    return Call("POST", "/train_begin", _with_id("train_begin", body, request_id), _timeout(timeout_s, default),
                TrainBegun.from_json)


def train_finished(cfg: ClientConfig, step: int, *, remaining_trajectories: int | None = None,
                   request_id: str | None = None, timeout_s: float | None = None) -> Call[TrainFinished]:
    """``remaining_trajectories``: how many of the rollout step in progress are still
    running (the borrowing gate's ``R``: it weighs the saving on what is left, and the
    tail-aware model takes the ones with the most turns left). Without it the router
    counts every trajectory it has seen this step as running."""
    body: dict[str, Any] = {"step": _step(step)}
    if remaining_trajectories is not None:
        body["remaining_trajectories"] = trajectory_count(remaining_trajectories)
    body = _with_id("train_finished", body, request_id)
    return Call("POST", "/train_finished", body, _timeout(timeout_s, cfg.timeout_s), TrainFinished.from_json)


def update_weights_from_disk(cfg: ClientConfig, *, version: str, model_path: str, load_format: str | None = None,
                             request_id: str | None = None, timeout_s: float | None = None) -> Call[WeightsUpdated]:
    body: dict[str, Any] = {"version": _text(version, "version"), "model_path": _text(model_path, "model_path")}
    if load_format is not None:
        body["load_format"] = _text(load_format, "load_format")
    return Call("POST", "/update_weights", _with_id("update_weights", body, request_id),
                _timeout(timeout_s, cfg.wait_timeout_s), WeightsUpdated.from_json)


def update_weights_from_distributed(cfg: ClientConfig, *, version: str, distributed: DistributedWeights,
                                    model_path: str | None = None, load_format: str | None = None,
                                    request_id: str | None = None,
                                    timeout_s: float | None = None) -> Call[WeightsUpdated]:
    if not isinstance(distributed, DistributedWeights):
        raise ValueError(f"distributed must be a DistributedWeights, got {type(distributed).__name__}")
    body: dict[str, Any] = {"version": _text(version, "version"), "distributed": distributed.to_json()}
    if model_path is not None:
        body["model_path"] = _text(model_path, "model_path")
    if load_format is not None:
        body["load_format"] = _text(load_format, "load_format")
    return Call("POST", "/update_weights", _with_id("update_weights", body, request_id),
                _timeout(timeout_s, cfg.wait_timeout_s), WeightsUpdated.from_json)


def init_weight_group(cfg: ClientConfig, *, group_name: str, master_address: str, master_port: int,
                      backend: str = "nccl", request_id: str | None = None,
                      timeout_s: float | None = None) -> Call[WeightGroup]:
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    body = {"action": "init", "group_name": _text(group_name, "group_name"),
            "master_address": _text(master_address, "master_address"),
            "master_port": _port(master_port), "backend": backend}
    return Call("POST", "/pearl/weight_group", _with_id("weight_group_init", body, request_id),
                _timeout(timeout_s, cfg.timeout_s), WeightGroup.from_json)


def destroy_weight_group(cfg: ClientConfig, group_name: str, *, request_id: str | None = None,
                         timeout_s: float | None = None) -> Call[WeightGroupDestroyed]:
    body = {"action": "destroy", "group_name": _text(group_name, "group_name")}
    return Call("POST", "/pearl/weight_group", _with_id("weight_group_destroy", body, request_id),
                _timeout(timeout_s, cfg.timeout_s), WeightGroupDestroyed.from_json)


def join_gpus(cfg: ClientConfig, gpus: Sequence[str], *, hosts: Mapping[str, str] | None = None,
              request_id: str | None = None, timeout_s: float | None = None) -> Call[GpusJoined]:
    body: dict[str, Any] = {"action": "join", "gpus": _gpus(gpus)}
    if hosts is not None:
        if not isinstance(hosts, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                                     for k, v in hosts.items()):
            raise ValueError(f"hosts must map node names to host addresses (non-empty strings), got {hosts!r}")
        if hosts:
            body["hosts"] = dict(hosts)
    return Call("POST", "/pearl/gpus", _with_id("gpus_join", body, request_id),
                _timeout(timeout_s, cfg.wait_timeout_s), GpusJoined.from_json)


def leave_gpus(cfg: ClientConfig, gpus: Sequence[str], *, deadline_s: float, request_id: str | None = None,
               timeout_s: float | None = None) -> Call[GpusLeft]:
    body = {"action": "leave", "gpus": _gpus(gpus), "deadline_s": _seconds(deadline_s, "deadline_s")}
    return Call("POST", "/pearl/gpus", _with_id("gpus_leave", body, request_id),
                _timeout(timeout_s, body["deadline_s"] + cfg.timeout_s), GpusLeft.from_json)


def state(cfg: ClientConfig, *, timeout_s: float | None = None) -> Call[dict[str, Any]]:
    return Call("GET", "/pearl/state", None, _timeout(timeout_s, cfg.timeout_s), state_from_json)


def _gpus(gpus: Sequence[str]) -> list[str]:
    if not isinstance(gpus, (list, tuple)) or not gpus or not all(isinstance(g, str) and g for g in gpus):
        raise ValueError(f"gpus must be a non-empty list of GPU ids like ['node3:0'], got {gpus!r}")
    return list(gpus)


# ---- wire ----------------------------------------------------------------------------

def url(cfg: ClientConfig, call: Call[Any]) -> str:
    return cfg.root + call.path


def headers(cfg: ClientConfig, call: Call[Any]) -> dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": USER_AGENT}
    if call.body is not None:
        out["Content-Type"] = "application/json"
    token = cfg.admin_token if call.admin else cfg.api_key
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def encode(call: Call[Any]) -> bytes | None:
    return None if call.body is None else json.dumps(call.body).encode()


def decode(call: Call[T], status: int, body: bytes) -> T:
    """The parsed answer of a 2xx, or raises the typed error for anything else."""
    if not 200 <= status < 300:
        raise error_for(call, status, body)
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        return call.parse(data)
    except (ValueError, LookupError, TypeError, AttributeError, ArithmeticError, RecursionError) as e:
        raise PearlProtocolError(f"unexpected answer ({e!r}): {_snippet(body)}", endpoint=call.endpoint,
                                 status=status, request_id=call.request_id) from e


def error_for(call: Call[Any], status: int, body: bytes) -> PearlError:
    message, kind = _router_error(body)
    if message is None:
        message = _snippet(body) or f"HTTP {status}"
    cls: type[PearlError]
    if status == 401:
        cls = PearlAuthError
    elif status == 409:
        cls = PearlConflict
    elif 400 <= status < 500:
        cls = PearlRejected
    elif status >= 500:
        cls = PearlUnavailable
    else:
        cls = PearlProtocolError
        if 300 <= status < 400:
            message = (f"HTTP {status} redirect, not followed (the admin token must not go elsewhere and a "
                       f"POST must not become a GET): set base_url to the router's own address")
    return cls(message, endpoint=call.endpoint, status=status, error_type=kind, request_id=call.request_id)


def connection_failed(call: Call[Any], exc: BaseException) -> PearlUnavailable:
    # The error's str, never its repr: aiohttp's reprs carry the request's headers, the
    # admin token among them.
    return PearlUnavailable(f"cannot reach PEARL: {type(exc).__name__}: {exc}", endpoint=call.endpoint,
                            request_id=call.request_id)


def timed_out(call: Call[Any]) -> PearlTimeout:
    return PearlTimeout(f"no answer within {call.timeout_s:g}s", endpoint=call.endpoint, request_id=call.request_id)


def retry_delay(call: Call[Any], error: PearlError, *, attempt: int, backoff_s: tuple[float, ...]) -> float | None:
    """Seconds to wait before retry number ``attempt`` (0-based), or None to give up."""
    if not call.idempotent or attempt >= len(backoff_s) or not isinstance(error, PearlUnavailable):
        return None
    if error.status is not None and error.status not in RETRY_STATUSES:
        return None
    return backoff_s[attempt]


def _router_error(body: bytes) -> tuple[str | None, str | None]:
    try:
        err = json.loads(body)["error"]
        return str(err["message"]), (str(err["type"]) if err.get("type") is not None else None)
    except (ValueError, LookupError, TypeError, AttributeError, RecursionError):
        return None, None


def _snippet(body: bytes, limit: int = 300) -> str:
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."
