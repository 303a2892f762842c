"""Synchronous PEARL admin client, for trainer drivers that are plain blocking code.

Uses only ``urllib.request`` so a trainer needs no extra HTTP library; requests and
answers come from ``protocol``, shared with the asyncio client. urllib's timeout is per
socket operation; the body is read in pieces against the call's deadline, so an answer
that trickles in ends with ``PearlTimeout`` on time too. Redirects are answers, not
followed (``protocol.error_for``).
"""
from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from pearl_rl_adapter import protocol
from pearl_rl_adapter.config import ClientConfig, resolve_config
from pearl_rl_adapter.errors import PearlConflict, PearlError, PearlTimeout
from pearl_rl_adapter.results import (DistributedWeights, GpusJoined, GpusLeft, TrainBegun, TrainFinished,
                                      WeightGroup, WeightGroupDestroyed, WeightsUpdated)
from pearl_rl_adapter.steps import note_unfinished, remaining_now

T = TypeVar("T")
log = logging.getLogger("pearl.adapter")


class PearlClient:
    """Blocking client for PEARL's admin API (``docs/admin-api.md``)."""

    def __init__(self, base_url: str | None = None, *, admin_token: str | None = None,
                 config: ClientConfig | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = resolve_config(base_url, admin_token=admin_token, config=config)
        self._sleep = sleep
        # No proxy handler: admin calls go straight to the router, as aiohttp's do.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())

    def __repr__(self) -> str:
        return f"PearlClient(base_url={self.config.base_url!r})"

    def close(self) -> None:
        """Nothing is pooled; present so both clients are closed the same way."""

    def __enter__(self) -> "PearlClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- admin API -------------------------------------------------------------------

    def train_begin(self, step: int, *, deadline_s: float | None = None, request_id: str | None = None,
                    timeout_s: float | None = None) -> TrainBegun:
        """Blocks until every borrowed training GPU is free again."""
        return self._send(protocol.train_begin(self.config, step, deadline_s=deadline_s, request_id=request_id,
                                               timeout_s=timeout_s))

    def train_finished(self, step: int, *, remaining_trajectories: int | None = None,
                       request_id: str | None = None, timeout_s: float | None = None) -> TrainFinished:
        return self._send(protocol.train_finished(self.config, step, remaining_trajectories=remaining_trajectories,
                                                  request_id=request_id, timeout_s=timeout_s))

    def update_weights_from_disk(self, *, version: str, model_path: str, load_format: str | None = None,
                                 request_id: str | None = None, timeout_s: float | None = None) -> WeightsUpdated:
        return self._send(protocol.update_weights_from_disk(
            self.config, version=version, model_path=model_path, load_format=load_format, request_id=request_id,
            timeout_s=timeout_s))

    def update_weights_from_distributed(self, *, version: str, distributed: DistributedWeights,
                                        model_path: str | None = None, load_format: str | None = None,
                                        request_id: str | None = None,
                                        timeout_s: float | None = None) -> WeightsUpdated:
        """Returns when every member received the broadcast; the trainer broadcasts each
        tensor of ``distributed`` from rank 0 while this call runs (another thread or
        task). ``model_path``: a disk copy of the same weights, for workers that join
        later (without it they cannot sync and their activation fails)."""
        return self._send(protocol.update_weights_from_distributed(
            self.config, version=version, distributed=distributed, model_path=model_path,
            load_format=load_format, request_id=request_id, timeout_s=timeout_s))

    def init_weight_group(self, *, group_name: str, master_address: str, master_port: int,
                          backend: str = "nccl", request_id: str | None = None,
                          timeout_s: float | None = None) -> WeightGroup:
        """PEARL's active workers start joining the group; then join it as rank 0 of
        ``world_size`` (``init_custom_process_group(..., group_name=group_name)``)."""
        return self._send(protocol.init_weight_group(
            self.config, group_name=group_name, master_address=master_address, master_port=master_port,
            backend=backend, request_id=request_id, timeout_s=timeout_s))

    def destroy_weight_group(self, group_name: str, *, request_id: str | None = None,
                             timeout_s: float | None = None) -> WeightGroupDestroyed:
        return self._send(protocol.destroy_weight_group(self.config, group_name, request_id=request_id,
                                                    timeout_s=timeout_s))

    def join_gpus(self, gpus: Sequence[str], *, hosts: Mapping[str, str] | None = None,
                  request_id: str | None = None, timeout_s: float | None = None) -> GpusJoined:
        return self._send(protocol.join_gpus(self.config, gpus, hosts=hosts, request_id=request_id,
                                             timeout_s=timeout_s))

    def leave_gpus(self, gpus: Sequence[str], *, deadline_s: float, request_id: str | None = None,
                   timeout_s: float | None = None) -> GpusLeft:
        return self._send(protocol.leave_gpus(self.config, gpus, deadline_s=deadline_s, request_id=request_id,
                                              timeout_s=timeout_s))

    def state(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return self._send(protocol.state(self.config, timeout_s=timeout_s))

    @contextmanager
    def training_step(self, step: int, *, deadline_s: float | None = None,
                      remaining: Callable[[], int | None] | None = None) -> Iterator[TrainBegun]:
        """Bracket one update: ``train_begin`` before (the body does not run if it
        fails; if it timed out, PEARL may still begin the step, so ``train_finished``
        closes it before the timeout propagates), ``train_finished`` after, also when the
        body raises; then the body's error propagates unchanged. ``remaining``: asked
        when the update ends, the rollout's trajectories still running then
        (``train_finished``'s ``remaining_trajectories``)."""
        try:
            begun = self.train_begin(step, deadline_s=deadline_s)
        except PearlTimeout as begin_error:
            try:  # PEARL may still begin the step: closed, so the next one is not refused
                self.train_finished(step)
            except PearlConflict:
                pass  # it never began
            except Exception as finish_error:  # noqa: BLE001 - the timeout is the error to report
                note_unfinished(step, begin_error, finish_error)
            raise
        try:
            yield begun
        except BaseException as body_error:
            try:
                self.train_finished(step, remaining_trajectories=remaining_now(remaining))
            except Exception as finish_error:  # noqa: BLE001 - the body's error wins
                note_unfinished(step, body_error, finish_error)
            raise
        self.train_finished(step, remaining_trajectories=remaining_now(remaining))

    # ---- transport -------------------------------------------------------------------

    def _send(self, call: protocol.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                status, body = self._exchange(call)
                return protocol.decode(call, status, body)
            except PearlError as error:
                delay = protocol.retry_delay(call, error, attempt=attempt, backoff_s=self.config.backoff_s)
                error.attempts = attempt + 1
                if delay is None:
                    raise
                log.warning("%s failed (%s); retry %d in %.2fs", call.endpoint, error.message, attempt + 1, delay)
                self._sleep(delay)
                attempt += 1

    def _exchange(self, call: protocol.Call[Any]) -> tuple[int, bytes]:
        request = urllib.request.Request(protocol.url(self.config, call), data=protocol.encode(call),
                                         headers=protocol.headers(self.config, call), method=call.method)
        deadline = time.monotonic() + call.timeout_s
        try:
            try:
                with self._opener.open(request, timeout=call.timeout_s) as response:
                    return response.status, _read_by(response, deadline)
            except urllib.error.HTTPError as e:
                with e:  # its body may break or stall too: the handlers below type that
                    return e.code, _read_by(e, deadline)
        except TimeoutError as e:
            raise protocol.timed_out(call) from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise protocol.timed_out(call) from e
            raise protocol.connection_failed(call, e.reason) from e
        except (OSError, http.client.HTTPException) as e:
            raise protocol.connection_failed(call, e) from e


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx comes back as the answer (an ``HTTPError``): the token must not go to another
    host, and a POST must not become a GET that seems to succeed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _read_by(response: Any, deadline: float, piece: int = 65536) -> bytes:
    """The whole body, or ``TimeoutError`` once ``deadline`` (monotonic) has passed."""
    parts = []
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive within the call's timeout")
        data = response.read1(piece) if hasattr(response, "read1") else response.read(piece)
        if not data:
            return b"".join(parts)
        parts.append(data)
