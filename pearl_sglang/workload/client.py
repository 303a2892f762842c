"""One rollout turn over HTTP: ``POST {router}/generate`` with bounded, typed retries.

This is the driver's only contact with the serving side; everything above it sees a
``Generation`` or a typed error, never an aiohttp response.  A failed attempt keeps the
trajectory's context untouched, so a retry resends the same prompt and the router's
prefix cache or partial-trajectory retention can still help.  Every attempt has a
timeout, so a turn ends (successfully or not) in bounded time.

A replay that runs the router in the driver's own process may hand the client a
``FrontDoor`` instead: the same body and headers reach the router's ``/generate`` without
HTTP, and its answer or error comes back as the HTTP status and body would have.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import aiohttp
import numpy as np

from pearl_rl_adapter.telemetry import tag_headers
from pearl_sglang import fastjson
from pearl_sglang.workload.errors import GenerateError, GenerateFailed, GenerateRejected, GenerateRetryable
from pearl_sglang.workload.timebase import EmulatedTime

log = logging.getLogger(__name__)

_RETRYABLE_4XX = frozenset({408, 429})


@dataclass(frozen=True)
class Generation:
    output_ids: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    attempts: int
    errors: tuple[str, ...]  # one line per failed attempt before the success
    request_s: float         # emulated seconds of the successful attempt
    weight_version: str | None = None  # what the worker reported (SGLang's meta_info), if it did


def _parse(body: Any, prompt_len: int) -> tuple[tuple[int, ...], int, int, str | None]:
    if not isinstance(body, dict) or not isinstance(body.get("output_ids"), list):
        raise GenerateRejected("answer has no output_ids list")
    ids = body["output_ids"]
    if ids and set(map(type, ids)) != {int}:  # in C; JSON gives no int subclass but bool
        raise GenerateRejected("output_ids holds a non-integer")
    meta = body.get("meta_info") if isinstance(body.get("meta_info"), dict) else {}
    prompt = meta.get("prompt_tokens")
    cached = meta.get("cached_tokens")
    version = meta.get("weight_version")
    return (tuple(ids), prompt if isinstance(prompt, int) else prompt_len,
            cached if isinstance(cached, int) else 0, version if isinstance(version, str) else None)


class FrontDoor(Protocol):
    """The router's ``/generate`` in this process (see the module's docstring)."""

    async def post_generate(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        """(200, the decoded answer) or (the error's HTTP status, its body's bytes)."""


class GenerateClient:
    def __init__(self, session: aiohttp.ClientSession, router_url: str, *, time: EmulatedTime,
                 retry_delays_s: Sequence[float] = (0.5, 2.0, 8.0),
                 request_timeout_s: float = 900.0,
                 headers: dict[str, str] | None = None,
                 front_door: FrontDoor | None = None) -> None:
        self.session = session
        self.url = router_url.rstrip("/") + "/generate"
        self.time = time
        self.retry_delays_s = tuple(retry_delays_s)
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.headers = dict(headers or {})
        self.front_door = front_door

    async def _attempt(self, body: dict, headers: dict[str, str]) -> Any:
        try:
            if self.front_door is None:
                status, data = await self._post(body, headers)
            else:
                async with asyncio.timeout(self.timeout.total):
                    status, data = await self.front_door.post_generate(body, headers)
        except asyncio.TimeoutError as e:
            raise GenerateRetryable("request timed out") from e
        except aiohttp.ClientError as e:
            raise GenerateRetryable(f"transport error: {e!r}") from e
        if status != 200:
            cls = GenerateRetryable if status >= 500 or status in _RETRYABLE_4XX else GenerateRejected
            raise cls(f"HTTP {status}: {data[:300].decode(errors='replace')}", status=status)
        return data

    async def _post(self, body: dict, headers: dict[str, str]) -> tuple[int, Any]:
        async with self.session.post(self.url, data=fastjson.dumps(body),
                                     headers={**fastjson.JSON_HEADERS, **headers},
                                     timeout=self.timeout) as resp:
            data = await resp.read()
            if resp.status != 200:
                return resp.status, data
        try:
            return 200, fastjson.loads(data)
        except ValueError as e:
            raise GenerateRejected("answer is not JSON") from e

    async def generate(self, input_ids: Sequence[int], *, max_new_tokens: int,
                       trajectory_id: str, turn: int, expected_turns: int | None = None) -> Generation:
        """Generate exactly ``max_new_tokens`` (``ignore_eos``) after ``input_ids``;
        ``expected_turns``: the trajectory's, for the router's critical path."""
        ids = input_ids if isinstance(input_ids, np.ndarray) else list(input_ids)
        body = {"input_ids": ids,
                "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}
        headers = {**self.headers, **tag_headers(trajectory_id, turn, expected_turns)}
        errors: list[str] = []
        delays = iter(self.retry_delays_s)
        while True:
            started = self.time.now()
            try:
                out, prompt, cached, version = _parse(await self._attempt(body, headers), len(body["input_ids"]))
                return Generation(output_ids=out, prompt_tokens=prompt, cached_tokens=cached,
                                  attempts=len(errors) + 1, errors=tuple(errors),
                                  request_s=self.time.now() - started, weight_version=version)
            except GenerateError as e:
                errors.append(str(e))
                delay = next(delays, None) if isinstance(e, GenerateRetryable) else None
                log.warning("trajectory %s turn %d attempt %d failed: %s",
                            trajectory_id, turn, len(errors), e)
                if delay is None:
                    raise GenerateFailed(f"trajectory {trajectory_id} turn {turn}: {e}",
                                         errors=tuple(errors)) from e
            await self.time.wait(delay)
