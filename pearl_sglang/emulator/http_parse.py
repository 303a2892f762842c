"""JSON bodies of /generate into typed requests, and handles back into SGLang JSON.

The checks follow SGLang 0.5.23 (sglang-protocol.md section 1): unknown
``sampling_params`` keys and wrongly typed values are refused with 400 ``{"error": str}``;
a body without text/input_ids is refused with 400 ``{"error": {"message": str}}``.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Optional

from .codec import GrowingText, TextCodec
from .prompt_ids import PromptIds
from .request import Bootstrap, GenerateRequest, Progress, RequestHandle, SamplingParams

SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice")
_INT = {"max_new_tokens": "u32", "min_new_tokens": "u32", "top_k": "i32", "n": "u32",
        "stream_interval": "u32", "sampling_seed": "u64", "beam_width": "u32"}
_FLOAT = {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
          "repetition_penalty"}
_BOOL = {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}


class BadRequest(Exception):
    def __init__(self, body: Any, status: int = 400) -> None:
        super().__init__(str(body))
        self.body, self.status = body, status


def _serde_kind(v: Any) -> str:
    if isinstance(v, bool):
        return f"boolean `{str(v).lower()}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, str):
        return f"string {v!r}"
    if isinstance(v, list):
        return "sequence"
    return "map" if isinstance(v, dict) else "null"


def _type_error(v: Any, expected: str) -> BadRequest:
    return BadRequest({"error": f"invalid type: {_serde_kind(v)}, expected {expected}"})


def parse_sampling(obj: Any) -> SamplingParams:
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise _type_error(obj, "struct SamplingParams")
    for k, v in obj.items():
        if k not in SAMPLING_KEYS:
            raise BadRequest({"error": f"unknown field `{k}`, expected one of "
                              + ", ".join(f"`{x}`" for x in SAMPLING_KEYS)})
        if v is None:
            continue
        if k in _INT and (isinstance(v, bool) or not isinstance(v, int) or v < 0 and k != "top_k"):
            raise _type_error(v, _INT[k])
        if k in _FLOAT and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _type_error(v, "f32")
        if k in _BOOL and not isinstance(v, bool):
            raise _type_error(v, "a boolean")
    stop = obj.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    elif stop is not None:
        raise _type_error(stop, "string or sequence of strings")
    ids = obj.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise _type_error(ids, "a sequence of integers")
    g = obj.get
    return SamplingParams(
        max_new_tokens=128 if g("max_new_tokens") is None else g("max_new_tokens"),
        min_new_tokens=g("min_new_tokens") or 0, stop_token_ids=frozenset(ids), stop=stop or (),
        ignore_eos=bool(g("ignore_eos")), stream_interval=g("stream_interval"),
        sampling_seed=g("sampling_seed"), no_stop_trim=bool(g("no_stop_trim")),
        skip_special_tokens=g("skip_special_tokens") is not False)


@dataclass(frozen=True)
class ParsedGenerate:
    items: tuple[GenerateRequest, ...]
    is_batch: bool
    stream: bool


def _message(msg: str) -> BadRequest:
    return BadRequest({"error": {"message": msg}})


def _per_item(body: dict, key: str, i: int, count: int) -> Any:
    value = body.get(key)
    if not isinstance(value, list):
        return value
    if len(value) != count:
        raise _message(f"{key} list must have one entry per request ({count}), got {len(value)}")
    return value[i]


def _prompt(ids: "list[int] | PromptIds") -> "tuple[int, ...] | PromptIds":
    return ids if isinstance(ids, PromptIds) else tuple(ids)


def parse_generate(body: Any, codec: TextCodec) -> ParsedGenerate:
    if not isinstance(body, dict):
        raise _message("request body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        raise _message("Either text, input_ids or input_embeds should be provided.")
    if text is not None and ids is not None:
        raise _message("Either text or input_ids should be provided.")
    if text is not None:
        is_batch = isinstance(text, list)
        texts = text if is_batch else [text]
        if not all(isinstance(t, str) for t in texts):
            raise _message("text must be a string or a list of strings")
        prompts = [codec.encode(t) for t in texts]
    elif isinstance(ids, PromptIds):  # one prompt its in-process caller has checked
        is_batch, prompts = False, [ids]
    else:
        is_batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if is_batch else [ids]
        for p in prompts:
            # set(map(type, p)) runs in C; it also refuses bools (type(True) is bool).
            if not isinstance(p, list) or (p and set(map(type, p)) != {int}):
                raise _message("input_ids must be a list of integers or a list of lists")
    sp = body.get("sampling_params")
    if isinstance(sp, list):
        if len(sp) != len(prompts):
            raise _message("sampling_params list must match the batch size")
        sampling = [parse_sampling(s) for s in sp]
    else:
        one = parse_sampling(sp)
        sampling = [one] * len(prompts)
    n = (sp or {}).get("n") if isinstance(sp, dict) else None
    if n and n > 1:
        prompts = [p for p in prompts for _ in range(n)]
        sampling = [s for s in sampling for _ in range(n)]
        is_batch = True
    rid = body.get("rid")
    count = len(prompts)
    if is_batch:
        if isinstance(rid, list):
            if len(rid) != count:
                raise _message("The rid list should have the same length as the batch.")
            rids = [str(r) for r in rid]
        elif rid is not None:
            rids = [f"{rid}_{i}" for i in range(count)]
        else:
            rids = [uuid.uuid4().hex for _ in range(count)]
    else:
        rids = [str(rid) if rid is not None else uuid.uuid4().hex]
    priority = body.get("priority")
    if priority is not None and (type(priority) is not int or not -(1 << 63) <= priority < (1 << 63)):
        raise _message("priority must be a signed 64-bit integer "
                       "between -9223372036854775808 and 9223372036854775807")
    room = body.get("bootstrap_room")
    items = []
    for i in range(count):
        h, p, r = (_per_item(body, key, i, count) for key in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
        if r is not None and not isinstance(room, list):
            r = room + i
        boot = Bootstrap(str(h), p, r) if h is not None or r is not None else None
        items.append(GenerateRequest(rid=rids[i], input_ids=_prompt(prompts[i]), sampling=sampling[i],
                                     bootstrap=boot, return_logprob=bool(_per_item(body, "return_logprob", i, count)),
                                     return_prompt_token_ids=body.get("return_prompt_token_ids") is True,
                                     priority=priority))
    return ParsedGenerate(tuple(items), is_batch, bool(body.get("stream")))


def output_text(codec: TextCodec, handle: RequestHandle, sp: SamplingParams,
                growing: Optional[GrowingText] = None) -> str:
    """The output's text as SGLang returns it; ``growing`` keeps a stream's earlier text."""
    ids = handle.output_ids
    fr = handle.finish_reason
    trim = fr is not None and fr.type == "stop" and not sp.no_stop_trim
    if trim and isinstance(fr.matched, int):
        ids = ids[:-1]
    text = (growing.decode(ids) if growing is not None
            else codec.decode(ids, skip_special_tokens=sp.skip_special_tokens))
    if trim and isinstance(fr.matched, str):
        idx = text.find(fr.matched)
        if idx >= 0:
            text = text[:idx]
    return held_back(text) if fr is None else text


def weight_spans(handle: RequestHandle) -> list[dict]:
    """The weight versions over the output's positions, as SGLang reports them."""
    return [{"version": v, "start": s, "end": e} for v, s, e in handle.weight_versions]


def held_back(text: str) -> str:
    """A running output's text: SGLang's detokenizer holds back an incomplete last
    character until its bytes are all there, so a stream's text only grows."""
    return text.rstrip("\ufffd")


def meta_info(handle: RequestHandle, req: GenerateRequest, *, version: str, final: bool,
              input_logprobs: Optional[list] = None, at: Optional[Progress] = None) -> dict:
    """``at``: the meta of a chunk read earlier, at that progress (of an unfinished request)."""
    fr = handle.finish_reason if at is None else None
    at = at or Progress.now(handle, version)
    n = at.completion_tokens
    meta: dict[str, Any] = {
        "id": handle.rid,
        "finish_reason": fr.to_json() if fr is not None else None,
        "prompt_tokens": handle.prompt_tokens,
        "completion_tokens": n,
        "cached_tokens": at.cached_tokens,
        "reasoning_tokens": 0,
        "weight_version": at.weight_version,
    }
    if final:
        meta["weight_versions"] = weight_spans(handle)
    meta["num_retractions"] = at.num_retractions
    if req.return_logprob:
        meta["input_token_logprobs"] = input_logprobs or []
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                         zip(handle.output_logprobs[:n], handle.output_ids[:n])]
        meta["input_top_logprobs"] = []
        meta["output_top_logprobs"] = []
    if final and handle.e2e_latency is not None:
        meta["e2e_latency"] = handle.e2e_latency
    return meta
