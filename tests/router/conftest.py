"""An in-process PEARL router (real aiohttp server on a free loopback port) per test."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest

from pearl_sglang.control.attach import attached_table
from pearl_sglang.state_store import StateStore
from pearl_sglang.server.compose import build_app
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.connections import start_site
from pearl_sglang.router.state import ROUTER
from pearl_sglang.workers import client

ADMIN_TOKEN = "test-admin-token"


@contextlib.asynccontextmanager
async def running_router(*, regular=(), prefill=(), decode=(), config: RouterConfig | None = None):
    config = config or RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600)
    store = StateStore(attached_table(regular=tuple(regular), prefill=tuple(prefill), decode=tuple(decode)))
    app = build_app(config, store)
    runner, port = await start_site(app, app[ROUTER].connections, "127.0.0.1", 0)
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


@pytest.fixture
def whole_calls(monkeypatch):
    """The bodies the router sent to workers as one-document calls (``client.generate_whole``)."""
    calls = []
    real = client.generate_whole

    def spy(connections, *, slot, url, body, timeouts):
        calls.append(body)
        return real(connections, slot=slot, url=url, body=body, timeouts=timeouts)

    monkeypatch.setattr(client, "generate_whole", spy)
    return calls
