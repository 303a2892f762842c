"""A run: requests a caller submitted to the engine together, read as a stream reads them.

``Run`` submits the requests, wakes its reader through a watch per request (the engine
calls back on tokens; a watch wakes the reader once per chunk), renders each chunk as
SGLang's ``/generate`` would (``body``), and aborts what is left when the reader goes
away.  A reader that keeps no chunks in between (``updates(every_chunk=False)``) lets the
engine keep their progress instead (``RequestHandle.progress``), and can still render the
chunk of that progress (``body(at=...)``).  The HTTP handlers (``http_generate``) and the
harness's in-process transport both read runs this way.
"""
from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any, AsyncIterator, Callable, Optional

from aiohttp import web

from .codec import GrowingText
from .http_parse import ParsedGenerate, held_back, meta_info, output_text
from .request import GenerateRequest, Progress, RequestHandle, RequestRejected
from .worker import Worker

DONE = b"data: [DONE]\n\n"


_NEVER = 1 << 62  # an output length no request reaches


class _Watch:
    """Wakes the handler when a request finishes or has ``next_at`` output tokens.

    A stream raises ``next_at`` by its interval after each chunk, so the handler wakes
    once per chunk, not once per token (the engine calls back on every token)."""

    __slots__ = ("event", "next_at")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.next_at = 0

    def __call__(self, handle: RequestHandle) -> None:
        if handle.finish_reason is not None or len(handle.output_ids) >= self.next_at:
            self.event.set()


def error_body(status: int, message: str) -> dict:
    if status == 400:
        return {"error": {"message": message}}
    return {"object": "error", "message": message, "type": HTTPStatus(status).phrase, "param": None,
            "code": status}


def _input_logprobs(ids: tuple[int, ...]) -> list:
    return [[None if i == 0 else -((t * 2654435761 + i) % 4000) / 1000.0, t, None]
            for i, t in enumerate(ids)]


STREAM_END_ABORT_DELAY_S = 2.0


def after_stream_end(worker: Worker, items: tuple[GenerateRequest, ...]) -> None:
    """SGLang 0.5.23 gives every streaming response a background task
    (``TokenizerManager.create_abort_task``) that, 2 s after the stream ends, aborts each of
    its rids that still names a live request.  That request can only be a later one that
    reused the rid, so a resubmission under the same rid within those 2 s is aborted.
    Only the deadline is kept here; ``Run`` arms the abort when a rid is reused in time."""
    try:
        now = asyncio.get_running_loop().time()
    except RuntimeError:  # a generator finalized after its loop closed: no later request
        return
    pending = worker.stream_end_aborts
    for rid in list(pending):
        if pending[rid] > now:
            break
        del pending[rid]
    for r in items:
        pending.pop(r.rid, None)
        pending[r.rid] = now + STREAM_END_ABORT_DELAY_S


def _arm_stream_end_aborts(worker: Worker, items: tuple[GenerateRequest, ...]) -> None:
    pending = worker.stream_end_aborts
    if not pending:
        return
    loop = asyncio.get_running_loop()
    for r in items:
        at = pending.get(r.rid)
        if at is not None and at > loop.time():
            loop.call_at(at, worker.engine.abort, r.rid)


class RunClosed(Exception):
    """The worker stopped under a run that a caller in the same process was waiting on."""


class Run:
    """A set of submitted requests and their watches."""

    def __init__(self, worker: Worker, items: tuple[GenerateRequest, ...], stream: bool) -> None:
        self.worker, self.items = worker, items
        self.closed = False
        self.watches = [_Watch() for _ in items]
        self.texts = [GrowingText(worker.codec, r.sampling.skip_special_tokens) for r in items]
        self.handles: list[RequestHandle] = []
        engine = worker.engine
        _arm_stream_end_aborts(worker, items)
        try:
            for req, w in zip(items, self.watches):
                self.handles.append(engine.submit(req, on_update=w if stream else None, on_finish=w))
        except RequestRejected:
            self.abort()
            raise

    def abort(self) -> None:
        for h in self.handles:
            if not h.finished:
                self.worker.engine.abort(h.rid)

    def close(self) -> None:
        """The worker is going away: wake every waiter, which then raises ``RunClosed``."""
        self.closed = True
        for w in self.watches:
            w.event.set()

    async def wait_all(self) -> None:
        try:
            for h, w in zip(self.handles, self.watches):
                while not h.finished:
                    await w.event.wait()
                    w.event.clear()
                    if self.closed:
                        raise RunClosed
        except asyncio.CancelledError:
            self.abort()
            raise

    def body(self, i: int, *, final: bool, at: Optional[Progress] = None) -> dict:
        """Request ``i``'s chunk now, or (``at``) the chunk it would have streamed at that
        progress, which the engine kept instead of waking the stream."""
        h, req = self.handles[i], self.items[i]
        inp = _input_logprobs(req.input_ids) if req.return_logprob else None
        if at is None:
            text, ids = self.text(i), list(h.output_ids)
        else:
            ids = h.output_ids[:at.completion_tokens]
            text = held_back(self.worker.codec.decode(ids, skip_special_tokens=req.sampling.skip_special_tokens))
        out = {"text": text,
               "output_ids": ids,
               "meta_info": meta_info(h, req, version=self.worker.engine.version, final=final,
                                      input_logprobs=inp, at=at)}
        if req.return_prompt_token_ids:  # SGLang sends them with every chunk
            out["prompt_token_ids"] = list(req.input_ids)
        return out

    def text(self, i: int) -> str:
        return output_text(self.worker.codec, self.handles[i], self.items[i].sampling, self.texts[i])

    def failed_status(self) -> Optional[tuple[int, str]]:
        for h in self.handles:
            fr = h.finish_reason
            if fr is not None and fr.type == "abort" and (fr.status_code or 0) >= 400:
                return fr.status_code, fr.message or "aborted"
        return None

    async def updates(self, intervals: list[int], *, every_chunk: bool = True) -> AsyncIterator[tuple[int, bool]]:
        """``(i, final)`` whenever request ``i`` has ``intervals[i]`` new tokens or finished.
        ``every_chunk`` False: each request's first chunk and its final one; in between the
        engine keeps what each chunk would have read (``RequestHandle.progress``) and wakes
        no one, so its decode stretches run on past them."""
        sent = [0] * len(self.handles)
        pending = set(range(len(self.handles)))
        for w, h, interval in zip(self.watches, self.handles, intervals):
            w.next_at = h.notify_at = interval
        while pending:
            if len(pending) == 1:
                await self.watches[next(iter(pending))].event.wait()
            elif not any(self.watches[i].event.is_set() for i in pending):
                waits = [asyncio.ensure_future(self.watches[i].event.wait()) for i in pending]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for f in waits:
                    f.cancel()
            if self.closed:
                raise RunClosed
            for i in sorted(pending):
                w, h = self.watches[i], self.handles[i]
                if not w.event.is_set():
                    continue
                w.event.clear()
                n = len(h.output_ids)
                if h.finished:
                    pending.discard(i)
                    yield i, True
                elif n - sent[i] >= intervals[i]:
                    sent[i] = n
                    if every_chunk:
                        w.next_at = h.notify_at = n + intervals[i]
                    else:
                        w.next_at = h.notify_at = _NEVER
                        h.progress_every, h.progress_next = intervals[i], n + intervals[i]
                    yield i, False

    async def stream(self, response: web.StreamResponse, intervals: list[int],
                     chunk: Callable[[int, bool], list[bytes]]) -> None:
        """Send chunks as requests progress; ``chunk(i, final)`` renders SSE lines."""
        try:
            async for i, final in self.updates(intervals):
                for line in chunk(i, final):
                    await response.write(line)
            await response.write(DONE)
        except (asyncio.CancelledError, ConnectionResetError):
            self.abort()
            raise
        finally:
            after_stream_end(self.worker, self.items)


def stream_intervals(worker: Worker, parsed: ParsedGenerate) -> list[int]:
    return [r.sampling.stream_interval or worker.args.stream_interval for r in parsed.items]


def final_answer(run: Run, parsed: ParsedGenerate) -> tuple[int, Any]:
    """The HTTP status and JSON document of a finished non-streaming run."""
    failed = run.failed_status()
    if failed is not None:
        return failed[0], error_body(*failed)
    bodies = [run.body(i, final=True) for i in range(len(parsed.items))]
    return 200, bodies if parsed.is_batch else bodies[0]


def chunk_body(run: Run, parsed: ParsedGenerate, i: int, final: bool, *, at: Optional[Progress] = None) -> dict:
    body = run.body(i, final=final, at=at)
    if parsed.is_batch:
        body["index"] = i
    return body
