"""HTTP calls to one SGLang worker, each a typed success or a ``WorkerError``.

One client for both sides of PEARL. The router's data path streams ``/generate`` (over
its own keep-alive connections, ``connections.py``) and aborts requests; the control
plane composes SGLang 0.5.23's engine calls into reconfigurations: pause and continue
generation, release and resume memory (torch memory saver), weight updates with
versions, in-place prefill <-> decode switches, ``/model_info`` for reconciliation and
a PD probe. Every failure is one of ``errors.py``'s, mapped from the HTTP answer in one
place (``status_error``).

Every ``/generate`` goes to workers as a stream, even when the client asked for one JSON
reply: the router then holds every token the worker reported, so a worker that dies
without answering (SGLang's scheduler can crash) loses nothing already generated. The one
exception is a turn for such a client whose token budget fits one stream interval
(``one_interval``): its stream would report at most its first token before its end
(SGLang sends that at once, then a chunk every interval), so it is asked for the one
document, which spares the worker and the router the stream's framing.

The dispatcher reaches workers through a ``WorkerTransport``: a ``WorkerClient`` for real
servers; the benchmark harness plugs in emulated workers that run in its own process
(``benchmarks.harness.in_process_transport``).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol
from urllib.parse import urlparse

import aiohttp

from pearl_sglang import fastjson
from pearl_sglang.workers.connections import ConnectFailed, ReadTimeout, WorkerConnections
from pearl_sglang.workers.errors import (
    WorkerError, WorkerFailed, WorkerRejected, WorkerStalled, WorkerUnavailable, status_error,
)

# A cumulative chunk of a long output (prompt ids included) can be megabytes long.
_READ_BUFSIZE = 1 << 24
_UNREACHABLE = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    # The stall bound: the longest a worker may stay silent on a stream (router/stall.py).
    chunk_s: float = 600.0
    # An abort: best effort, bounded.
    control_s: float = 30.0
    # An engine call of the control plane (a weight load or a memory resume takes a while).
    operation_s: float = 120.0


def _error_event(worker: str, event: dict[str, Any]) -> WorkerError:
    err = event.get("error")
    info = err if isinstance(err, dict) else {"message": str(err)}
    code = info.get("code") if isinstance(info.get("code"), int) else 500
    if 400 <= code < 500:
        return WorkerRejected(worker, code, json.dumps({"error": info}).encode())
    return WorkerFailed(worker, f"error event: {info.get('message')}")


async def _post_generate(connections: WorkerConnections, worker: str, url: str, body: dict[str, Any],
                         timeouts: Timeouts):
    """``/generate`` sent, its answer's head read: the connection, or the worker's refusal
    (``status_error``) once its body is read. The caller reads the rest and releases it."""
    conn = await connections.post(url, "/generate", fastjson.dumps(body), read_s=timeouts.chunk_s)
    if conn.status >= 400:
        try:
            raise status_error(worker, conn.status, await conn.read_all(),
                               conn.headers.get("content-type", "application/json"))
        finally:
            connections.release(conn)
    return conn


async def stream_generate(connections: WorkerConnections, *, slot: int, url: str,
                          body: dict[str, Any], timeouts: Timeouts) -> AsyncIterator[dict[str, Any]]:
    """Yield the worker's cumulative chunks; the last one carries ``finish_reason``."""
    worker = str(slot)
    done = False
    conn = None
    try:
        conn = await _post_generate(connections, worker, url, {**body, "stream": True}, timeouts)
        rest = b""
        while True:
            piece = await conn.read_piece()
            ended = piece is None
            if done or (ended and not rest):
                if ended:
                    break
                continue  # read to the end: a finished answer hands its connection back
            if ended:
                piece = b"\n"  # the body's last line came without its newline
            lines = (rest + piece).split(b"\n") if rest else piece.split(b"\n")
            rest = lines.pop()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                event = fastjson.loads(payload)
                if "error" in event:
                    raise _error_event(worker, event)
                yield event
            if ended:
                break
    except ReadTimeout as e:
        if not done:
            raise WorkerStalled(worker, f"no chunk for {timeouts.chunk_s:.0f}s (stall bound)") from e
    except (ConnectFailed, ConnectionError, ValueError) as e:
        if not done:
            raise WorkerUnavailable(worker, f"stream broke: {e!r}") from e
    finally:
        if conn is not None:
            connections.release(conn)
    if not done:
        raise WorkerUnavailable(worker, "stream ended without [DONE]")


def one_interval(body: dict[str, Any]) -> bool:
    """Whether a ``/generate`` body's token budget fits one stream interval: its stream
    would report at most its first token before its end."""
    sampling = body.get("sampling_params")
    if not isinstance(sampling, dict):
        return False
    budget, interval = sampling.get("max_new_tokens"), sampling.get("stream_interval")
    return type(budget) is int and type(interval) is int and 0 <= budget <= interval


async def generate_whole(connections: WorkerConnections, *, slot: int, url: str,
                         body: dict[str, Any], timeouts: Timeouts) -> AsyncIterator[dict[str, Any]]:
    """The worker's answer as one document (``stream`` false): what its stream would end
    with. Yields it once, with the failures of ``stream_generate``."""
    worker = str(slot)
    conn = None
    try:
        conn = await _post_generate(connections, worker, url, {**body, "stream": False}, timeouts)
        document = fastjson.loads(await conn.read_all())
    except ReadTimeout as e:
        raise WorkerStalled(worker, f"no answer for {timeouts.chunk_s:.0f}s (stall bound)") from e
    except (ConnectFailed, ConnectionError, ValueError) as e:
        raise WorkerUnavailable(worker, f"answer broke: {e!r}") from e
    finally:
        if conn is not None:
            connections.release(conn)
    if not isinstance(document, dict) or not isinstance(document.get("meta_info"), dict):
        raise WorkerFailed(worker, "a /generate answer without meta_info")
    yield document


class WorkerTransport(Protocol):
    """The calls the dispatcher makes to a worker, with the failures of ``errors.py``. A
    body's ``input_ids`` may be ``EncodedIds`` (ids kept as their JSON text): ``fastjson``
    writes them as that text; a transport that needs a list calls ``decoded()``.

    ``stream_generate`` with ``every_chunk`` False may leave out chunks between the first
    and the final one (nobody streams them on), but if the stream breaks it yields the
    latest chunk it left out before raising, so what was generated is kept; for a budget
    of one stream interval (``one_interval``) it may yield the final answer alone."""

    def stream_generate(self, *, slot: int, url: str, body: dict[str, Any],
                        every_chunk: bool = True) -> AsyncIterator[dict[str, Any]]: ...

    async def post_json(self, *, slot: int, url: str, path: str, body: Any) -> Any: ...

    async def abort(self, *, url: str, rid: str) -> bool: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class WorkerClient:
    """Streams over keep-alive connections of its own (``connections.py``); every other
    call over the application's aiohttp session."""

    session: aiohttp.ClientSession
    timeouts: Timeouts = Timeouts()
    connections: WorkerConnections | None = None

    def __post_init__(self) -> None:
        if self.connections is None:
            object.__setattr__(self, "connections", WorkerConnections(connect_s=self.timeouts.connect_s))

    # -- the data path (WorkerTransport) ---------------------------------------------------
    def stream_generate(self, *, slot: int, url: str, body: dict[str, Any],
                        every_chunk: bool = True) -> AsyncIterator[dict[str, Any]]:
        """Every chunk the worker sends; without ``every_chunk``, a budget of one stream
        interval is asked for as one document instead (``one_interval``)."""
        call = stream_generate if every_chunk or not one_interval(body) else generate_whole
        return call(self.connections, slot=slot, url=url, body=body, timeouts=self.timeouts)

    async def post_json(self, *, slot: int, url: str, path: str, body: Any) -> Any:
        """A prefill or tokenizer call that answers with one JSON document (or none)."""
        timeouts = self.timeouts
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.chunk_s)
        return _document(await self._call(url, "POST", path, fastjson.dumps(body), timeout, worker=str(slot)),
                         fastjson.loads)

    async def abort(self, *, url: str, rid: str) -> bool:
        """Best effort: a worker that cannot be reached holds nothing we can save anyway."""
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeouts.control_s, sock_connect=self.timeouts.connect_s)
            async with self.session.post(url + "/abort_request", json={"rid": rid}, timeout=timeout) as resp:
                return resp.status == 200
        except _UNREACHABLE:
            return False

    async def close(self) -> None:
        self.connections.close()

    # -- one call ----------------------------------------------------------------------------
    async def _call(self, url: str, method: str, path: str, data: bytes | None, timeout: aiohttp.ClientTimeout,
                    *, worker: str) -> bytes:
        try:
            async with self.session.request(method, url + path, data=data, timeout=timeout,
                                            headers=fastjson.JSON_HEADERS if data is not None else None,
                                            read_bufsize=_READ_BUFSIZE) as resp:
                answer = await resp.read()
                if resp.status >= 400:
                    raise status_error(worker, resp.status, answer,
                                       resp.headers.get("Content-Type", "application/json"), path=path)
        except _UNREACHABLE as e:
            raise WorkerUnavailable(worker, repr(e), path=path) from e
        return answer

    async def _op(self, url: str, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> Any:
        """An engine call of the control plane; ``success: false`` is a failure too."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeouts.operation_s)
        # The standard library's JSON here: engine answers may carry NaN or Infinity.
        data = None if body is None else json.dumps(body).encode()
        out = _document(await self._call(url, method, path, data, timeout, worker=url), json.loads)
        if isinstance(out, dict) and out.get("success") is False:
            raise WorkerFailed(url, str(out.get("message")), path=path)
        return out

    # -- the control plane's engine calls ------------------------------------------------------
    async def health(self, url: str, *, timeout_s: float | None = None) -> None:
        await self._op(url, "GET", "/health", timeout_s=timeout_s)

    async def server_info(self, url: str) -> dict[str, Any]:
        return await self._op(url, "GET", "/server_info")

    async def model_info(self, url: str) -> dict[str, Any]:
        return await self._op(url, "GET", "/model_info")

    async def loads(self, url: str) -> dict[str, Any]:
        return await self._op(url, "GET", "/v1/loads")

    async def pause(self, url: str, mode: str = "abort") -> None:
        await self._op(url, "POST", "/pause_generation", {"mode": mode})

    async def resume_generation(self, url: str) -> None:
        await self._op(url, "POST", "/continue_generation", {})

    async def release_memory(self, url: str) -> None:
        await self._op(url, "POST", "/release_memory_occupation", {"tags": None})

    async def frees_memory_on_release(self, url: str) -> bool | None:
        """Whether ``/release_memory_occupation`` really frees GPU memory on this worker:
        SGLang reports ``enable_memory_saver`` in ``/server_info`` (without it a release
        answers success and frees nothing). None when the engine does not say."""
        info = await self._op(url, "GET", "/server_info")
        value = info.get("enable_memory_saver") if isinstance(info, dict) else None
        return value if isinstance(value, bool) else None

    async def resume_memory(self, url: str) -> None:
        await self._op(url, "POST", "/resume_memory_occupation", {"tags": None})

    async def update_from_disk(self, url: str, *, model_path: str, version: str,
                               load_format: str | None = None) -> None:
        body: dict[str, Any] = {"model_path": model_path, "weight_version": version}
        if load_format:
            body["load_format"] = load_format
        await self._op(url, "POST", "/update_weights_from_disk", body)

    async def set_version(self, url: str, version: str) -> None:
        await self._op(url, "POST", "/update_weight_version", {"new_version": version,
                                                                "abort_all_requests": False})

    async def init_weight_group(self, url: str, *, master_address: str, master_port: int, rank_offset: int,
                                world_size: int, group_name: str, backend: str, timeout_s: float) -> None:
        """Returns only once every rank, the trainer's rank 0 included, has joined."""
        await self._op(url, "POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}, timeout_s=timeout_s)

    async def destroy_weight_group(self, url: str, group_name: str) -> None:
        await self._op(url, "POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def update_from_distributed(self, url: str, *, group_name: str, names: list[str], dtypes: list[str],
                                      shapes: list[list[int]], version: str) -> None:
        """Receive one broadcast of every tensor from rank 0. SGLang on CPU refuses this
        outside ``/begin_weight_update`` .. ``/end_weight_update`` (and a trainer already
        broadcasting then hangs), so callers bracket it with ``begin``/``end``."""
        await self._op(url, "POST", "/begin_weight_update", {})
        try:
            await self._op(url, "POST", "/update_weights_from_distributed", {
                "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                "flush_cache": True, "abort_all_requests": False, "weight_version": version})
        except BaseException:
            with contextlib.suppress(WorkerError):  # the update's error is the one to report
                await self._op(url, "POST", "/end_weight_update", {})
            raise
        await self._op(url, "POST", "/end_weight_update", {})

    async def switch_role(self, url: str, role: str) -> dict[str, Any]:
        body: dict[str, Any] = {"new_role": role}
        if role == "decode":
            body["decode_cuda_graph_memory_gb"] = 0
        return await self._op(url, "POST", "/pd_role_switch", body)

    async def pd_probe(self, *, prefill_url: str, bootstrap_port: int, decode_url: str) -> None:
        """One tiny PD request through this pair: proves the KV-transfer path (bootstrap,
        registration, transfer) works before the pair serves real traffic."""
        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
                "bootstrap_host": urlparse(prefill_url).hostname, "bootstrap_port": bootstrap_port,
                "bootstrap_room": secrets.randbits(63), "rid": f"pearl-probe-{secrets.token_hex(6)}"}
        _, out = await asyncio.gather(self._op(prefill_url, "POST", "/generate", body),
                                      self._op(decode_url, "POST", "/generate", body))
        if not isinstance(out, dict) or not out.get("output_ids"):
            raise WorkerFailed(decode_url, f"unexpected answer {str(out)[:200]}", path="pd probe")


def _document(answer: bytes, loads: Callable[[bytes], Any]) -> Any:
    """One JSON document, the text when the answer is not JSON, None when it is empty."""
    if not answer.strip():
        return None
    try:
        return loads(answer)
    except ValueError:
        return answer.decode(errors="replace")


TransportFactory = Callable[[aiohttp.ClientSession, Timeouts], WorkerTransport]
