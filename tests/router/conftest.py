"""An in-process PEARL router (real aiohttp server on a free loopback port) per test."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from aiohttp import web

from pearl_sglang.control.attach import attached_table
from pearl_sglang.control.state_store import StateStore
from pearl_sglang.router.app import build_app
from pearl_sglang.router.config import RouterConfig, Security

ADMIN_TOKEN = "test-admin-token"


@contextlib.asynccontextmanager
async def running_router(*, regular=(), prefill=(), decode=(), config: RouterConfig | None = None):
    config = config or RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600)
    store = StateStore(attached_table(regular=tuple(regular), prefill=tuple(prefill), decode=tuple(decode)))
    app = build_app(config, store)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp exposes no getter
    try:
        yield f"http://127.0.0.1:{port}", app, store
    finally:
        await runner.cleanup()


@pytest.fixture
def admin_headers():
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def with_limits(**kw) -> RouterConfig:
    base = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600)
    return replace(base, limits=replace(base.limits, **kw))
