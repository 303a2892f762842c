"""Rollout generation through PEARL's router: SGLang's native ``/generate`` with token ids.

RL frameworks need the sampled token ids and their log-probs, not text, so shims call
``/generate`` with ``input_ids`` and ``return_logprob``. Building the body and reading
the answer are pure functions (tested without a framework); ``RolloutClient`` is the
one asyncio transport, tagging every request with its trajectory and turn. Generation
is not idempotent (sampling differs), so nothing here retries.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any, Mapping, Sequence

from pearl_rl_adapter import protocol
from pearl_rl_adapter.aio import exchange
from pearl_rl_adapter.config import ClientConfig, resolve_config
from pearl_rl_adapter.sessions import LoopSession
from pearl_rl_adapter.telemetry import tag_headers


@dataclass(frozen=True)
class Generated:
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...] | None
    finish_reason: str | None

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


def generate_body(prompt_ids: Sequence[int], sampling_params: Mapping[str, Any], *,
                  return_logprob: bool = True) -> dict[str, Any]:
    """``ValueError`` for a prompt that is not token ids (a string is text, not ids)."""
    if (isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence)
            or not all(isinstance(t, Integral) and not isinstance(t, bool) for t in prompt_ids)):
        raise ValueError(f"prompt_ids must be a list of token ids (ints), got {_short(prompt_ids)}")
    if not isinstance(sampling_params, Mapping):
        raise ValueError(f"sampling_params must be a mapping, got {_short(sampling_params)}")
    return {"input_ids": [int(t) for t in prompt_ids], "sampling_params": dict(sampling_params),
            "return_logprob": bool(return_logprob)}


def parse_generate(data: Mapping[str, Any]) -> Generated:
    """SGLang answers ``output_ids`` and ``meta_info.output_token_logprobs`` as
    ``[logprob, token_id, text]`` triples; either gives the token ids. An answer with
    neither is not a generation (a proxy's or another server's JSON): ``ValueError``,
    which ``protocol.decode`` turns into ``PearlProtocolError``."""
    meta = data.get("meta_info", {})
    if not isinstance(meta, Mapping):
        raise ValueError(f"meta_info is not an object: {_short(meta)}")
    triples = meta.get("output_token_logprobs")
    ids = data.get("output_ids")
    if ids is None and triples is None:
        raise ValueError("neither output_ids nor meta_info.output_token_logprobs in the answer")
    log_probs = tuple(float(t[0]) for t in triples) if triples else None
    if ids is None:
        ids = [t[1] for t in triples]
    if isinstance(ids, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"output_ids are not token ids: {_short(ids)}")
    finish = meta.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, Mapping) else finish
    return Generated(token_ids=tuple(ids), log_probs=log_probs, finish_reason=None if reason is None else str(reason))


def generate_call(cfg: ClientConfig, body: Mapping[str, Any], *, timeout_s: float | None = None
                  ) -> protocol.Call[Generated]:
    if not isinstance(body, Mapping):
        raise ValueError(f"a /generate body must be a mapping, got {_short(body)}")
    return protocol.Call("POST", "/generate", body, cfg.wait_timeout_s if timeout_s is None else timeout_s,
                         parse_generate, admin=False)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class RolloutClient:
    """asyncio ``/generate`` client with one session; uses the inference API key."""

    def __init__(self, base_url: str | None = None, *, config: ClientConfig | None = None) -> None:
        self.config = resolve_config(base_url, config=config)
        self._session = LoopSession(repr(self))

    def __repr__(self) -> str:
        return f"RolloutClient(base_url={self.config.base_url!r})"

    async def aclose(self) -> None:
        await self._session.close()

    async def generate(self, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any], *,
                       trajectory_id: str | None = None, turn: int | None = None,
                       expected_turns: int | None = None, timeout_s: float | None = None) -> Generated:
        """``expected_turns``: the trajectory's expected turns in all, if known (needs
        ``trajectory_id``; ``telemetry.tag_headers``)."""
        if expected_turns is not None and trajectory_id is None:
            raise ValueError("expected_turns needs trajectory_id")
        headers = tag_headers(trajectory_id, turn or 0, expected_turns) if trajectory_id is not None else {}
        return await self.post_generate(generate_body(prompt_ids, sampling_params), headers=headers,
                                        timeout_s=timeout_s)

    async def post_generate(self, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None,
                            timeout_s: float | None = None) -> Generated:
        call = generate_call(self.config, body, timeout_s=timeout_s)
        if headers is not None and not (isinstance(headers, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise ValueError(f"headers must map header names to string values, got {_short(headers)}")
        status, raw = await exchange(self._session.get(), self.config, call, headers)
        return protocol.decode(call, status, raw)
