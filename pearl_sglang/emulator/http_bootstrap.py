"""PD rendezvous across processes: the emulated prefill's bootstrap server and the
decode's client for it.

The prefill (and, with role switching, every PD instance) serves the bootstrap port
like SGLang does: ``GET /health`` answers 200 and ``GET /route`` describes the instance.
The KV hand-off itself uses an emulator-only long poll, ``POST /pearl_emulator/kv``
with ``{"room": R}``: it returns when the prefill has computed room R and the modelled
transfer has finished, with the first token and the prefill's accounting.  Emulated
and real SGLang workers therefore cannot be mixed within one PD pair.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import TYPE_CHECKING, Optional

import aiohttp
from aiohttp import web

from .request import KVPayload

if TYPE_CHECKING:
    from .engine import Engine
    from .pd import KVSink
    from .worker import ScaledClock

KV_PATH = "/pearl_emulator/kv"
ENGINE = web.AppKey("bootstrap_engine", object)


class _FutureSink:
    def __init__(self, fut: "asyncio.Future[KVPayload | str]") -> None:
        self.fut = fut

    def kv_ready(self, payload: KVPayload) -> None:
        if not self.fut.done():
            self.fut.set_result(payload)

    def kv_failed(self, message: str) -> None:
        if not self.fut.done():
            self.fut.set_result(message)


def create_bootstrap_app(engine: "Engine", clock: "ScaledClock") -> web.Application:
    app = web.Application()
    app[ENGINE] = engine

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def route(request: web.Request) -> web.Response:
        return web.json_response({"emulator": True, "role": engine.role.value,
                                  "kv_path": KV_PATH})

    async def kv(request: web.Request) -> web.Response:
        body = await request.json()
        room = body.get("room")
        if not isinstance(room, int):
            return web.json_response({"error": "room must be an integer"}, status=400)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        engine.accept_decode(room, _FutureSink(fut))
        try:
            result = await fut
        except asyncio.CancelledError:
            engine.cancel_decode(room)
            raise
        if isinstance(result, str):
            return web.json_response({"error": result}, status=409)
        return web.json_response(dataclasses.asdict(result))

    app.router.add_get("/health", health)
    app.router.add_get("/route", route)
    app.router.add_post(KV_PATH, kv)
    return app


class HttpRendezvous:
    """Decode side: one long-poll task per room, on the app's shared ClientSession."""

    def __init__(self) -> None:
        self.session: Optional[aiohttp.ClientSession] = None
        self._tasks: dict[tuple[str, int, int], asyncio.Task] = {}

    def bind(self, host: str, port: int, engine: "Engine") -> None:
        """The bootstrap server is started by the shell; nothing to register."""

    def unbind(self, host: str, port: int, engine: "Engine") -> None:
        """See ``bind``."""

    def connect(self, host: str, port: int, room: int, sink: "KVSink") -> None:
        key = (host, port, room)
        self._tasks[key] = asyncio.get_running_loop().create_task(self._wait(key, sink))

    def cancel(self, host: str, port: int, room: int) -> None:
        task = self._tasks.pop((host, port, room), None)
        if task is not None:
            task.cancel()

    async def _wait(self, key: tuple[str, int, int], sink: "KVSink") -> None:
        host, port, room = key
        host = f"[{host}]" if ":" in host else host
        try:
            if self.session is None:
                raise RuntimeError("HTTP rendezvous used before the server started")
            async with self.session.post(f"http://{host}:{port}{KV_PATH}", json={"room": room}) as resp:
                data = await resp.json()
            if resp.status == 200:
                sink.kv_ready(KVPayload(**data))
            else:
                sink.kv_failed(str(data.get("error")))
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, OSError, RuntimeError, ValueError) as e:
            sink.kv_failed(f"bootstrap server {host}:{port} unreachable: {e}")
        finally:
            self._tasks.pop(key, None)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
