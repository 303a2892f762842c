"""OpenAI requests as ``/generate`` items, and the dispatcher's output as OpenAI answers.

SGLang 0.5.23's OpenAI endpoints do not stream token ids, so a request proxied to them
cannot move when its worker leaves. Instead the router renders and tokenizes the prompt
once at a worker (``/tokenize`` applies the chat template), runs ``input_ids`` through
the dispatcher like any ``/generate`` item (migrated and stitched token-exactly; with
``n > 1``, one item per choice), and renders the stitched cumulative chunks here.
Requests whose answer needs the worker's own OpenAI layer (tool calls, response formats,
logprobs, batched prompts, ...) are not eligible and keep the proxy. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Fields this path understands; a request with any other one keeps the proxy, so nothing
# a client asked for is silently ignored.
_COMMON = frozenset({
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "stop", "stop_token_ids", "seed", "n", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_tokens", "ignore_eos", "skip_special_tokens", "no_stop_trim", "rid",
    "user",
})
_CHAT = _COMMON | {"messages", "max_completion_tokens", "chat_template_kwargs", "continue_final_message"}
_COMPLETION = _COMMON | {"prompt"}
# OpenAI name -> SGLang sampling_params name.
_SAMPLING = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop",
    "stop_token_ids": "stop_token_ids", "seed": "sampling_seed", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_new_tokens", "ignore_eos": "ignore_eos", "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
}


def _text_only(messages: Any) -> bool:
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return False
        if m.get("tool_calls") or m.get("role") == "tool":
            return False
    return True


def eligible(body: dict[str, Any], *, chat: bool) -> bool:
    """Whether the request can run through the dispatcher without losing anything."""
    if not set(body) <= (_CHAT if chat else _COMPLETION):
        return False
    if chat:
        return _text_only(body["messages"])
    prompt = body.get("prompt")
    return isinstance(prompt, str) or (isinstance(prompt, list) and bool(prompt)
                                       and all(type(t) is int for t in prompt))


def tokenize_body(body: dict[str, Any], *, chat: bool) -> dict[str, Any] | None:
    """What to ask a worker's ``/tokenize``; None when the prompt is token ids already."""
    if not chat:
        return {"prompt": body["prompt"]} if isinstance(body["prompt"], str) else None
    out = {"messages": body["messages"]}
    for key in ("chat_template_kwargs", "continue_final_message"):
        if key in body:
            out[key] = body[key]
    return out


def sampling_params(body: dict[str, Any], *, chat: bool, prompt_len: int, max_model_len: int | None,
                    cap: int) -> dict[str, Any]:
    """SGLang's defaults: a completion gets 16 tokens, a chat the rest of the context."""
    # As SGLang: a chat's ``max_completion_tokens or max_tokens`` (a null or 0 falls through).
    budget = (body.get("max_completion_tokens") or body.get("max_tokens")) if chat else body.get("max_tokens")
    if budget is None:
        budget = max(1, min(cap, (max_model_len or cap) - prompt_len - 1)) if chat else 16
    sampling = {"max_new_tokens": budget}
    for key, name in _SAMPLING.items():
        if body.get(key) is not None:
            sampling[name] = body[key]
    return sampling


def _finish(meta: dict[str, Any]) -> tuple[str | None, Any]:
    reason = meta.get("finish_reason")
    if not reason:
        return None, None
    kind = reason.get("type")
    return kind, reason.get("matched") if kind == "stop" else None


def usage(metas: list[dict[str, Any]], *, drop_none: bool = False) -> dict[str, Any]:
    """A prompt's usage over its choices' final ``meta_info``, counted and shaped as SGLang's
    ``UsageInfo`` for ``n > 1``: the prompt and its cached tokens once (choice 0's), every
    completion. ``drop_none``: the form of a streamed completion's usage chunk."""
    prompt = int(metas[0].get("prompt_tokens") or 0)
    completion = sum(int(m.get("completion_tokens") or 0) for m in metas)
    cached = metas[0].get("cached_tokens")
    out = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
           "prompt_tokens_details": {"cached_tokens": cached} if cached else None, "reasoning_tokens": 0,
           "completion_tokens_details": None}
    return {k: v for k, v in out.items() if v is not None} if drop_none else out


@dataclass
class Renderer:
    """Turns the stitched cumulative chunks of a request's ``n`` samples (one dispatcher
    item each, choice ``index`` 0..n-1) into OpenAI objects shaped as SGLang 0.5.23 shapes
    them (checked against a real server: tests/router/test_router_realsglang.py). Text is
    the stitched ``text`` of ``/generate`` (cumulative), sent as increments past the length
    already sent, as SGLang's own streaming does (a final text trimmed at its stop string
    sends nothing more). A chat stream opens each choice with an empty assistant delta and
    ends it with a delta-less finish event; a completion's events carry ``usage: null`` and
    its last text carries the finish reason. With ``include_usage`` the stream ends with one
    usage event once every choice has finished."""

    rid: str
    model: str
    created: int
    chat: bool
    include_usage: bool = False
    n: int = 1
    _sent: list[int] = field(init=False)  # characters sent, per choice
    _started: list[bool] = field(init=False)
    _finals: dict[int, dict[str, Any]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._sent = [0] * self.n
        self._started = [False] * self.n

    @property
    def _object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def _envelope(self, choices: list[dict[str, Any]], obj: str) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _chat_event(self, index: int, delta: dict[str, Any], reason: str | None, matched: Any) -> dict[str, Any]:
        return self._envelope([{"index": index, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                                "finish_reason": reason, "matched_stop": matched}], "chat.completion.chunk")

    def chunks(self, out: dict[str, Any], index: int = 0) -> list[dict[str, Any]]:
        """The stream events for choice ``index``'s cumulative chunk (its last one carries
        finish_reason)."""
        text = out.get("text") or ""
        delta = text[self._sent[index]:]
        self._sent[index] = len(text)
        meta = out.get("meta_info") or {}
        reason, matched = _finish(meta)
        started, self._started[index] = self._started[index], True
        events = []
        if self.chat:
            if not started:
                events.append(self._chat_event(index, {"role": "assistant", "content": ""}, None, None))
            if delta:
                events.append(self._chat_event(index, {"content": delta}, None, None))
            if reason is not None:
                events.append(self._chat_event(index, {}, reason, matched))
        elif delta or reason is not None or not started:
            events.append({**self._envelope([{"index": index, "text": delta, "logprobs": None, "finish_reason": reason,
                                              "matched_stop": matched}], self._object), "usage": None})
        if reason is not None:
            self._finals[index] = meta
            if self.include_usage and len(self._finals) == self.n:
                metas = [self._finals[i] for i in range(self.n)]
                obj = "chat.completion.chunk" if self.chat else self._object
                events.append({**self._envelope([], obj), "usage": usage(metas, drop_none=not self.chat)})
        return events

    def whole(self, outs: list[dict[str, Any]]) -> dict[str, Any]:
        """The non-streaming answer for the choices' final stitched chunks, in index order."""
        choices = []
        for index, out in enumerate(outs):
            reason, matched = _finish(out.get("meta_info") or {})
            text = out.get("text") or ""
            choice: dict[str, Any] = {"index": index}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None}
            else:
                choice["text"] = text
            choice.update({"logprobs": None, "finish_reason": reason, "matched_stop": matched})
            choices.append(choice)
        metas = [out.get("meta_info") or {} for out in outs]
        answer = {**self._envelope(choices, self._object), "usage": usage(metas)}
        if metas[0].get("weight_version") is not None:
            answer["metadata"] = {"weight_version": metas[0]["weight_version"]}
            if metas[0].get("weight_versions") is not None:
                answer["metadata"]["weight_versions"] = metas[0]["weight_versions"]
        return answer
