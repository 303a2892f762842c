"""The router's worker transport for emulated workers in the same process.

The benchmark harness replays hundreds of thousands of turns; over loopback HTTP, JSON
and aiohttp on both sides of the router-to-worker hop cost about a fifth of a replay's
CPU.  ``InProcessTransport`` skips that hop: the router's body goes through the
emulator's own ``/generate`` parser into its engine (a prompt the router checked,
``EncodedIds``, as a uint64 array: ``PromptIds``), and the router gets the chunk dicts
the HTTP handler would have sent, with the same typed failures.  Everything else the
router and control plane say to the workers (aborts by other paths, drains, weight
updates, memory, KV bootstrap, health probes) still goes over HTTP to the same servers.

A worker stopped mid-stream ends the stream with ``WorkerUnavailable``, as the closed
connection of an HTTP stream does.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from pearl_sglang import fastjson
from pearl_sglang.emulator.http_parse import BadRequest, ParsedGenerate, parse_generate
from pearl_sglang.emulator.prompt_ids import PromptIds
from pearl_sglang.emulator.request import RequestRejected
from pearl_sglang.emulator.runs import (
    Run, RunClosed, after_stream_end, chunk_body, error_body, final_answer, stream_intervals,
)
from pearl_sglang.emulator.worker import Worker
from pearl_sglang.router.encoded_ids import EncodedIds
from pearl_sglang.workers.errors import WorkerUnavailable, status_error

WorkerResolver = Callable[[str], "Worker | None"]


def _rejection(slot: int, status: int, body: Any) -> Exception:
    return status_error(str(slot), status, fastjson.dumps(body))


class InProcessTransport:
    """``WorkerTransport`` over the emulated workers that ``resolve`` finds by endpoint."""

    def __init__(self, resolve: WorkerResolver) -> None:
        self.resolve = resolve

    def _open(self, slot: int, url: str, body: Any, *, stream: bool) -> tuple[Worker, ParsedGenerate, Run]:
        worker = self.resolve(url)
        if worker is None or worker.closed:
            raise WorkerUnavailable(str(slot), f"no emulated worker at {url}")
        ids = body.get("input_ids")
        if isinstance(ids, EncodedIds):  # ids the router has checked: the engine hashes them as an array
            body = {**body, "input_ids": PromptIds(ids.as_uint64())}
        try:
            parsed = parse_generate({**body, "stream": stream}, worker.codec)
            return worker, parsed, Run(worker, parsed.items, stream)
        except BadRequest as e:
            raise _rejection(slot, e.status, e.body) from e
        except RequestRejected as e:
            raise _rejection(slot, e.status, error_body(e.status, e.message)) from e

    async def stream_generate(self, *, slot: int, url: str, body: dict[str, Any],
                              every_chunk: bool = True) -> AsyncIterator[dict[str, Any]]:
        """Without ``every_chunk``: the first chunk and the final one; the engine keeps the
        progress between (``Run.updates``), and a stream that breaks first yields the chunk
        of each request's latest progress, as the last chunk read over HTTP would be."""
        worker, parsed, run = self._open(slot, url, body, stream=True)
        worker.direct_runs.add(run)
        try:
            async for i, final in run.updates(stream_intervals(worker, parsed), every_chunk=every_chunk):
                yield chunk_body(run, parsed, i, final)
        except RunClosed:
            worker.engine.advance()  # the stretch iterations that ended by now, with their progress
            for i, h in enumerate(run.handles):
                if h.progress is not None and not h.finished:
                    yield chunk_body(run, parsed, i, False, at=h.progress)
            raise WorkerUnavailable(str(slot), "stream broke: the worker stopped") from None
        finally:
            worker.direct_runs.discard(run)
            run.abort()
            after_stream_end(worker, parsed.items)

    async def close(self) -> None:
        return None  # nothing of its own to close: the workers belong to the harness

    async def post_json(self, *, slot: int, url: str, path: str, body: Any) -> Any:
        if path != "/generate":
            raise ValueError(f"the in-process transport serves /generate only, not {path}")
        worker, parsed, run = self._open(slot, url, body, stream=False)
        worker.direct_runs.add(run)
        try:
            await run.wait_all()
        except RunClosed:
            raise WorkerUnavailable(str(slot), "/generate failed: the worker stopped") from None
        finally:
            worker.direct_runs.discard(run)
            run.abort()
        status, answer = final_answer(run, parsed)
        if status != 200:
            raise _rejection(slot, status, answer)
        return answer

    async def abort(self, *, url: str, rid: str) -> bool:
        worker = self.resolve(url)
        if worker is None or worker.closed:
            return False
        worker.engine.abort(rid)
        return True
