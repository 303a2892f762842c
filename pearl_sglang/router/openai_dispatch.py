"""The worker calls an OpenAI request makes besides generation: its prompt rendered and
tokenized once (``/tokenize``), and, once it has moved between workers, its whole output
decoded again (``/detokenize``) so text stays right across the seam."""
from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator

from pearl_sglang.router import openai_generate
from pearl_sglang.router.errors import BadRequest, UpstreamFailed
from pearl_sglang.router.selection import prefix_key
from pearl_sglang.router.state import RouterState
from pearl_sglang.workers.errors import WorkerFailed, WorkerUnavailable


async def whole_text(st: RouterState, run: AsyncIterator[dict[str, Any]], *,
                      skip_special_tokens: Any) -> AsyncIterator[dict[str, Any]]:
    """Chunks whose text is right across a migration. Each attempt's worker decodes only
    its own segment, so a character whose bytes span two segments would come out as two
    replacement characters: once a request has moved, its whole output is decoded by a
    worker (``/detokenize``) instead, holding back an incomplete last character as
    SGLang's own streaming does."""
    async with contextlib.aclosing(run):
        async for chunk in run:
            if (chunk.get("meta_info") or {}).get("pearl_attempts", 1) > 1 and chunk.get("output_ids"):
                text = await _detokenize(st, chunk["output_ids"], skip_special_tokens)
                if (chunk["meta_info"].get("finish_reason") is None) and text.endswith("\ufffd"):
                    text = text.rstrip("\ufffd")
                chunk = {**chunk, "text": text}
            yield chunk


async def _post_any(st: RouterState, path: str, request: dict[str, Any], *, key: tuple[int, ...],
                    trajectory: str | None, what: str, failure: str) -> tuple[int, Any]:
    """``request`` posted to ``path`` of a routable worker, the next one tried while they
    are unreachable or fail; returns the answering worker's slot and its reply. Not a
    placement: the request's own route is not remembered."""
    failed: set[int] = set()
    last_error: Exception | None = None
    for _ in range(st.config.dispatch.max_attempts):
        worker = (await st.dispatcher.route(key, trajectory=trajectory, exclude=failed, what=what,
                                            remember=False)).main
        try:
            return worker.slot, await st.dispatcher.transport.post_json(
                slot=worker.slot, url=worker.endpoint, path=path, body=request)
        except (WorkerUnavailable, WorkerFailed) as e:
            failed.add(worker.slot)
            last_error = e
    raise UpstreamFailed(f"{failure}: {last_error}")


async def _detokenize(st: RouterState, ids: list[int], skip_special_tokens: Any) -> str:
    slot, reply = await _post_any(st, "/detokenize", {"tokens": ids, "skip_special_tokens": bool(skip_special_tokens)},
                                  key=(), trajectory=None, what="/detokenize",
                                  failure="no worker could decode a migrated output")
    if not isinstance(reply, dict) or not isinstance(reply.get("text"), str):
        raise UpstreamFailed(f"worker {slot} answered /detokenize without text: {str(reply)[:200]}")
    return reply["text"]


async def prompt_ids(st: RouterState, body: dict[str, Any], *, chat: bool, trajectory: str | None,
                      what: str) -> tuple[list[int], int | None]:
    """The prompt's token ids, rendered and tokenized once by a worker (chat template and
    tokenizer stay the workers'); a completion prompt given as ids is used as it is."""
    request = openai_generate.tokenize_body(body, chat=chat)
    if request is None:
        if not body["prompt"]:
            raise BadRequest("the prompt is empty: there is nothing to generate from")
        return list(body["prompt"]), None
    slot, reply = await _post_any(st, "/tokenize", request, key=prefix_key(None, json.dumps(request)),
                                  trajectory=trajectory, what=what,
                                  failure=f"no worker could tokenize the prompt of {what}")
    tokens = reply.get("tokens") if isinstance(reply, dict) else None
    if tokens == []:
        raise BadRequest("the prompt is empty once rendered: there is nothing to generate from")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise UpstreamFailed(f"worker {slot} answered /tokenize without token ids: {str(reply)[:200]}")
    max_len = reply.get("max_model_len")
    return tokens, max_len if type(max_len) is int and 0 < max_len < 2**31 else None
