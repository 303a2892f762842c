"""Admin hooks over the RL adapter's client, against an in-process server that speaks
the documented contract: calls arrive in order with the admin token, a 503 on
``train_begin`` is retried with the same idempotency key, and the pushed version is
the one the router answers with."""
from __future__ import annotations

from aiohttp import web

from pearl_rl_adapter.aio import AsyncPearlClient
from pearl_rl_adapter.config import ClientConfig
from pearl_sglang.workload import AgenticRLDriver, DriverConfig, TrainerProfile, admin_hooks
from tests.workload.support import TINY, Scripted, scaled_time


class AdminServer:
    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, dict, str]] = []
        self.fail_first = fail_first
        self.generate = Scripted([])

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append((request.path, body, request.headers.get("Authorization", "")))
        if len(self.calls) <= self.fail_first:
            return web.json_response({"error": {"message": "busy", "type": "busy", "code": 503}}, status=503)
        if request.path == "/update_weights":
            return web.json_response({"version": body["version"], "workers": {"0": "ok"},
                                      "latest": body["version"]})
        if request.path == "/train_begin":
            return web.json_response({"step": body["step"], "returned_gpus": [], "elapsed_s": 0.0,
                                      "duplicate": False})
        return web.json_response({"step": body["step"], "borrowing": False, "reason": "test",
                                  "duplicate": False})

    async def __aenter__(self) -> str:
        app = web.Application()
        for path in ("/train_begin", "/train_finished", "/update_weights"):
            app.router.add_post(path, self.handle)
        app.router.add_post("/generate", self.generate.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


async def test_driver_drives_the_admin_api_in_order():
    server = AdminServer(fail_first=1)
    time = scaled_time()
    async with server as url:
        async with AsyncPearlClient(config=ClientConfig(base_url=url, admin_token="tok",
                                                        backoff_s=(0.01,))) as client:
            hooks = admin_hooks(client, model_path="/ckpt", run_id="r1")
            results = await AgenticRLDriver(url, workload=TINY, time=time, hooks=hooks,
                                            trainer_profile=TrainerProfile(seconds_per_step=1.0),
                                            config=DriverConfig(steps=2)).run()
    assert [r.weight_version for r in results] == ["r1-step-0", "r1-step-1"]
    paths = [p for p, _, _ in server.calls]
    assert paths == ["/train_begin", "/train_begin", "/train_finished", "/update_weights",
                     "/train_begin", "/train_finished", "/update_weights"]
    assert server.calls[0][1]["request_id"] == server.calls[1][1]["request_id"]
    assert all(auth == "Bearer tok" for _, _, auth in server.calls)
    assert server.calls[3][1]["model_path"] == "/ckpt"
    assert [b["step"] for p, b, _ in server.calls if p != "/update_weights"] == [0, 0, 0, 1, 1]
