"""asyncio PEARL admin client, for trainers whose driver runs an event loop.

One ``aiohttp.ClientSession`` per client and event loop (``sessions.LoopSession``),
opened on first use and closed by ``aclose()`` or ``async with``. Requests and answers
come from ``protocol``, shared with the blocking client, so both behave the same; only
the transport differs (``exchange``, which ``rollout.RolloutClient`` sends through too).
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence, TypeVar

import aiohttp

from pearl_rl_adapter import protocol
from pearl_rl_adapter.config import ClientConfig, resolve_config
from pearl_rl_adapter.errors import PearlConflict, PearlError, PearlTimeout
from pearl_rl_adapter.results import (DistributedWeights, GpusJoined, GpusLeft, TrainBegun, TrainFinished,
                                      WeightGroup, WeightGroupDestroyed, WeightsUpdated)
from pearl_rl_adapter.sessions import LoopSession
from pearl_rl_adapter.steps import note_unfinished, remaining_now

T = TypeVar("T")
log = logging.getLogger("pearl.adapter")


class AsyncPearlClient:
    """asyncio client for PEARL's admin API (``docs/admin-api.md``)."""

    def __init__(self, base_url: str | None = None, *, admin_token: str | None = None,
                 config: ClientConfig | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.config = resolve_config(base_url, admin_token=admin_token, config=config)
        self._sleep = sleep
        self._session = LoopSession(repr(self))

    def __repr__(self) -> str:
        return f"AsyncPearlClient(base_url={self.config.base_url!r})"

    async def aclose(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> "AsyncPearlClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- admin API -------------------------------------------------------------------

    async def train_begin(self, step: int, *, deadline_s: float | None = None, request_id: str | None = None,
                          timeout_s: float | None = None) -> TrainBegun:
        """Returns when every borrowed training GPU is free again."""
        return await self._send(protocol.train_begin(self.config, step, deadline_s=deadline_s,
                                                     request_id=request_id, timeout_s=timeout_s))

    async def train_finished(self, step: int, *, remaining_trajectories: int | None = None,
                             request_id: str | None = None, timeout_s: float | None = None) -> TrainFinished:
        return await self._send(protocol.train_finished(self.config, step,
                                                        remaining_trajectories=remaining_trajectories,
                                                        request_id=request_id, timeout_s=timeout_s))

    async def update_weights_from_disk(self, *, version: str, model_path: str, load_format: str | None = None,
                                       request_id: str | None = None,
                                       timeout_s: float | None = None) -> WeightsUpdated:
        return await self._send(protocol.update_weights_from_disk(
            self.config, version=version, model_path=model_path, load_format=load_format, request_id=request_id,
            timeout_s=timeout_s))

    async def update_weights_from_distributed(self, *, version: str, distributed: DistributedWeights,
                                        model_path: str | None = None, load_format: str | None = None,
                                        request_id: str | None = None,
                                        timeout_s: float | None = None) -> WeightsUpdated:
        """Returns when every member received the broadcast; the trainer broadcasts each
        tensor of ``distributed`` from rank 0 while this call runs (another thread or
        task). ``model_path``: a disk copy of the same weights, for workers that join
        later (without it they cannot sync and their activation fails)."""
        return await self._send(protocol.update_weights_from_distributed(
            self.config, version=version, distributed=distributed, model_path=model_path,
            load_format=load_format, request_id=request_id, timeout_s=timeout_s))

    async def init_weight_group(self, *, group_name: str, master_address: str, master_port: int,
                          backend: str = "nccl", request_id: str | None = None,
                          timeout_s: float | None = None) -> WeightGroup:
        """PEARL's active workers start joining the group; then join it as rank 0 of
        ``world_size`` (``init_custom_process_group(..., group_name=group_name)``)."""
        return await self._send(protocol.init_weight_group(
            self.config, group_name=group_name, master_address=master_address, master_port=master_port,
            backend=backend, request_id=request_id, timeout_s=timeout_s))

    async def destroy_weight_group(self, group_name: str, *, request_id: str | None = None,
                             timeout_s: float | None = None) -> WeightGroupDestroyed:
        return await self._send(protocol.destroy_weight_group(self.config, group_name, request_id=request_id,
                                                    timeout_s=timeout_s))

    async def join_gpus(self, gpus: Sequence[str], *, hosts: Mapping[str, str] | None = None,
                        request_id: str | None = None, timeout_s: float | None = None) -> GpusJoined:
        return await self._send(protocol.join_gpus(self.config, gpus, hosts=hosts, request_id=request_id,
                                                   timeout_s=timeout_s))

    async def leave_gpus(self, gpus: Sequence[str], *, deadline_s: float, request_id: str | None = None,
                         timeout_s: float | None = None) -> GpusLeft:
        return await self._send(protocol.leave_gpus(self.config, gpus, deadline_s=deadline_s,
                                                    request_id=request_id, timeout_s=timeout_s))

    async def state(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self._send(protocol.state(self.config, timeout_s=timeout_s))

    @asynccontextmanager
    async def training_step(self, step: int, *, deadline_s: float | None = None,
                            remaining: Callable[[], int | None] | None = None) -> AsyncIterator[TrainBegun]:
        """Bracket one update: ``train_begin`` before (the body does not run if it
        fails), ``train_finished`` after, also when the body raises or is cancelled;
        then the body's error propagates unchanged. ``remaining``: as in
        ``PearlClient.training_step``."""
        try:
            begun = await self.train_begin(step, deadline_s=deadline_s)
        except PearlTimeout as begin_error:
            try:  # as in PearlClient.training_step
                await self.train_finished(step)
            except PearlConflict:
                pass
            except Exception as finish_error:  # noqa: BLE001 - the timeout is the error to report
                note_unfinished(step, begin_error, finish_error)
            raise
        try:
            yield begun
        except BaseException as body_error:
            try:
                await self.train_finished(step, remaining_trajectories=remaining_now(remaining))
            except Exception as finish_error:  # noqa: BLE001 - the body's error wins
                note_unfinished(step, body_error, finish_error)
            raise
        await self.train_finished(step, remaining_trajectories=remaining_now(remaining))

    # ---- transport -------------------------------------------------------------------

    async def _send(self, call: protocol.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                status, body = await self._exchange(call)
                return protocol.decode(call, status, body)
            except PearlError as error:
                delay = protocol.retry_delay(call, error, attempt=attempt, backoff_s=self.config.backoff_s)
                error.attempts = attempt + 1
                if delay is None:
                    raise
                log.warning("%s failed (%s); retry %d in %.2fs", call.endpoint, error.message, attempt + 1, delay)
                await self._sleep(delay)
                attempt += 1

    async def _exchange(self, call: protocol.Call[Any]) -> tuple[int, bytes]:
        return await exchange(self._session.get(), self.config, call)


async def exchange(session: aiohttp.ClientSession, cfg: ClientConfig, call: protocol.Call[Any],
                   extra_headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """One request of ``call`` over ``session``: its status and body, or the typed error
    for a timeout or a connection that failed. Redirects are answers, not followed."""
    headers = protocol.headers(cfg, call)
    if extra_headers:
        headers.update(extra_headers)
    try:
        async with session.request(call.method, protocol.url(cfg, call), data=protocol.encode(call), headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=call.timeout_s),
                                   allow_redirects=False) as response:
            return response.status, await response.read()
    except asyncio.TimeoutError as e:
        raise protocol.timed_out(call) from e
    except aiohttp.ClientError as e:
        raise protocol.connection_failed(call, e) from e
