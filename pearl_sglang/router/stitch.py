"""Stitch one response out of the segments of a request that moved between workers.

When a worker leaves, is drained or dies mid-request, the dispatcher resubmits
prompt + tokens-so-far elsewhere with the remaining budget. The client must still see
ONE response: output ids and text concatenated, token counts summed, ``weight_versions``
spans shifted to their place in the whole output and merged where adjacent spans share a
version. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


# Per-output-token lists that continue across segments.
_CONCATENATED_META = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


@dataclass
class _Segment:
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def _spans(seg: _Segment, offset: int) -> list[dict[str, Any]]:
    spans = seg.meta.get("weight_versions")
    if not spans:
        version = seg.meta.get("weight_version")
        spans = [{"version": version, "start": 0, "end": len(seg.output_ids)}] if seg.output_ids else []
    return [{"version": s["version"], "start": s["start"] + offset, "end": s["end"] + offset}
            for s in spans]


def merge_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for span in spans:
        if merged and merged[-1]["version"] == span["version"] and merged[-1]["end"] == span["start"]:
            merged[-1] = {**merged[-1], "end": span["end"]}
        elif span["end"] > span["start"]:
            merged.append(dict(span))
    return merged


class Stitcher:
    """Accumulates cumulative chunks of successive attempts of one request."""

    def __init__(self, rid: str, prompt_ids: Sequence[int] | None = None) -> None:
        self.rid = rid
        self.prompt_ids = prompt_ids
        self._done: list[_Segment] = []
        self._current = _Segment()
        self.attempts = 1

    @property
    def generated_ids(self) -> list[int]:
        ids: list[int] = []
        for seg in (*self._done, self._current):
            ids.extend(seg.output_ids)
        return ids

    @property
    def generated(self) -> int:
        return sum(len(s.output_ids) for s in self._done) + len(self._current.output_ids)

    def update(self, chunk: dict[str, Any]) -> None:
        """Take the latest cumulative chunk of the current attempt."""
        self._current.output_ids = list(chunk.get("output_ids") or [])
        if chunk.get("text") is not None:
            self._current.text = chunk["text"]
        self._current.meta = dict(chunk.get("meta_info") or {})
        if self.prompt_ids is None and chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = list(chunk["prompt_token_ids"])

    def next_attempt(self) -> None:
        """The current attempt ended without finishing: keep its tokens, start another."""
        if self._current.output_ids:
            self._done.append(self._current)
        self._current = _Segment()
        self.attempts += 1

    def merged(self, *, e2e_latency: float | None = None) -> dict[str, Any]:
        """The response so far, as one. A streaming client gets this for every chunk, so
        what only a finished response carries (the weight-version spans) is built only then."""
        segments = [*self._done, self._current] if self._current.meta or not self._done else self._done
        first, last = segments[0], segments[-1]
        output_ids = list(first.output_ids)
        for seg in segments[1:]:
            output_ids.extend(seg.output_ids)
        meta = dict(last.meta)
        meta["id"] = self.rid
        meta["prompt_tokens"] = first.meta.get("prompt_tokens", meta.get("prompt_tokens"))
        meta["cached_tokens"] = first.meta.get("cached_tokens", meta.get("cached_tokens"))
        meta["completion_tokens"] = len(output_ids)
        meta["num_retractions"] = sum([s.meta.get("num_retractions", 0) or 0 for s in segments])
        reason = meta.get("finish_reason")
        if reason is not None:
            spans: list[dict[str, Any]] = []
            offset = 0
            for seg in segments:
                spans.extend(_spans(seg, offset))
                offset += len(seg.output_ids)
            meta["weight_versions"] = merge_spans(spans)
            if reason.get("type") == "length" and len(segments) > 1:
                meta["finish_reason"] = {**reason, "length": offset}
        else:
            meta.pop("weight_versions", None)
        if e2e_latency is not None:
            meta["e2e_latency"] = e2e_latency
        else:
            meta.pop("e2e_latency", None)
        for key in _CONCATENATED_META:
            parts = [s.meta[key] for s in segments if key in s.meta]
            if parts:
                meta[key] = [x for part in parts for x in (part or [])]
        if "output_token_logprobs_length" in meta:
            meta["output_token_logprobs_length"] = len(meta.get("output_token_logprobs") or [])
        if self.attempts > 1:
            meta["pearl_attempts"] = self.attempts
        return {
            "text": first.text if len(segments) == 1 else "".join([s.text for s in segments]),
            "output_ids": output_ids,
            "meta_info": meta,
        }
