"""A tiny PEARL control plane for adapter tests: a real aiohttp server on port 0.

It keeps the admin API's contract (docs/admin-api.md) minimally: bearer-token auth,
request_id deduplication, 409 for out-of-order steps, the router's error JSON. Tests
steer it with ``fail``, ``delay`` and ``drop`` and read ``calls`` (requests that were
answered, in order) and ``attempts`` (every request that arrived, dropped ones too).
It runs its own event loop in a thread so blocking clients can call it too.
"""
from __future__ import annotations

import asyncio
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "s3cret-admin-token"
STEP_PATHS = ("/train_begin", "/train_finished")


@dataclass
class Seen:
    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]


@dataclass
class FakePearl:
    token: str = TOKEN
    calls: list[Seen] = field(default_factory=list)
    attempts: list[Seen] = field(default_factory=list)
    failures: dict[str, deque] = field(default_factory=lambda: defaultdict(deque))
    delays: dict[str, float] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    open_step: int | None = None
    answers: dict[str, dict] = field(default_factory=dict)
    url: str = ""
    step_lock: asyncio.Lock | None = None

    # ---- steering ----------------------------------------------------------------------
    def fail(self, path: str, status: int, message: str = "injected", kind: str = "injected", *, times: int = 1,
             raw: bytes | None = None) -> None:
        for _ in range(times):
            self.failures[path].append((status, message, kind, raw))

    def delay(self, path: str, seconds: float) -> None:
        self.delays[path] = seconds

    def drop(self, path: str, times: int) -> None:
        self.drops[path] += times

    def order(self) -> list[str]:
        out = []
        for c in self.calls:
            step = (c.body or {}).get("step", (c.body or {}).get("version", ""))
            out.append(f"{c.path}:{step}" if step != "" else c.path)
        return out

    # ---- server --------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        body = await request.json() if request.can_read_body else None
        seen = Seen(request.path, body, dict(request.headers))
        self.attempts.append(seen)
        if self.drops[request.path] > 0:
            self.drops[request.path] -= 1
            request.transport.abort()
            raise asyncio.CancelledError  # nothing is answered on a dropped connection
        if request.path in STEP_PATHS:  # one at a time, as under the router's control lock
            async with self._step_lock():
                return await self._answer(request, handler, body, seen)
        return await self._answer(request, handler, body, seen)

    def _step_lock(self) -> asyncio.Lock:
        if self.step_lock is None:
            self.step_lock = asyncio.Lock()
        return self.step_lock

    async def _answer(self, request: web.Request, handler, body: Any, seen: Seen) -> web.StreamResponse:
        if request.path in self.delays:
            await asyncio.sleep(self.delays[request.path])
        if request.path != "/generate" and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "missing or wrong admin token (Authorization: Bearer ...)", "unauthorized")
        if self.failures[request.path]:
            status, message, kind, raw = self.failures[request.path].popleft()
            if raw is not None:
                return web.Response(status=status, body=raw, content_type="text/html")
            return _error(status, message, kind)
        rid = (body or {}).get("request_id")
        if rid is not None and rid in self.answers:
            self.calls.append(seen)
            return web.json_response({**self.answers[rid], "duplicate": True})
        response = await handler(request, body)
        self.calls.append(seen)
        if rid is not None and response.status == 200:
            self.answers[rid] = response.data  # type: ignore[attr-defined]
        return response

    async def train_begin(self, request: web.Request, body: dict) -> web.Response:
        if self.open_step is not None:
            return _error(409, f"train_begin({body['step']}) while step {self.open_step} is open", "conflict")
        self.open_step = body["step"]
        return _json({"step": body["step"], "returned_gpus": ["node1:0"], "elapsed_s": 0.01, "duplicate": False})

    async def train_finished(self, request: web.Request, body: dict) -> web.Response:
        if self.open_step != body["step"]:
            return _error(409, f"train_finished({body['step']}) without train_begin", "conflict")
        self.open_step = None
        return _json({"step": body["step"], "borrowing": True, "reason": "benefit", "duplicate": False})

    async def update_weights(self, request: web.Request, body: dict) -> web.Response:
        return _json({"version": body["version"], "workers": {"0": "ok", "1": "ok"}, "latest": body["version"]})

    async def weight_group(self, request: web.Request, body: dict) -> web.Response:
        if body["action"] == "destroy":
            return _json({"group_name": body["group_name"], "destroyed": True, "members": {"0": "ok", "1": "ok"}})
        return _json({"group_name": body["group_name"], "world_size": 3, "backend": body["backend"],
                      "members": [{"slot": 0, "rank_offset": 1}, {"slot": 1, "rank_offset": 2}]})

    async def gpus(self, request: web.Request, body: dict) -> web.Response:
        if body["action"] == "join":
            return _json({"action": "join", "admitted": [f"slot-{g}" for g in body["gpus"]], "cancelled": False})
        return _json({"action": "leave", "removed": [f"slot-{g}" for g in body["gpus"]], "elapsed_s": 0.5})

    async def state(self, request: web.Request, body: Any) -> web.Response:
        return _json({"workers": [{"slot": "0", "role": "decode"}], "open_step": self.open_step})

    async def generate(self, request: web.Request, body: dict) -> web.Response:
        n = len(body["input_ids"])
        return _json({"text": "x", "output_ids": [n, n + 1],
                      "meta_info": {"finish_reason": {"type": "length"},
                                    "output_token_logprobs": [[-0.5, n, None], [-0.25, n + 1, None]]}})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/train_begin", self.train_begin)
        app.router.add_post("/train_finished", self.train_finished)
        app.router.add_post("/update_weights", self.update_weights)
        app.router.add_post("/pearl/gpus", self.gpus)
        app.router.add_post("/pearl/weight_group", self.weight_group)
        app.router.add_get("/pearl/state", self.state)
        app.router.add_post("/generate", self.generate)
        return app


def _json(data: dict) -> web.Response:
    response = web.json_response(data)
    response.data = data  # type: ignore[attr-defined]
    return response


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class ServerThread:
    """Runs a ``FakePearl`` on 127.0.0.1:0 in a thread with its own event loop."""

    def __init__(self, fake: FakePearl) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.fake.app(), handle_signals=False)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.fake.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def __enter__(self) -> FakePearl:
        self._thread.start()
        self._ready.wait(10)
        return self.fake

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
