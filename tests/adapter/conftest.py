from __future__ import annotations

import pytest

from pearl_rl_adapter import AsyncPearlClient, ClientConfig, PearlClient
from tests.adapter.fake_pearl import TOKEN, FakePearl, ServerThread

BACKOFF = (0.01, 0.02, 0.03)


@pytest.fixture
def fake():
    with ServerThread(FakePearl()) as f:
        yield f


@pytest.fixture
def config(fake) -> ClientConfig:
    return ClientConfig(base_url=fake.url, admin_token=TOKEN, timeout_s=5.0, wait_timeout_s=5.0, backoff_s=BACKOFF)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(config, sleeps) -> PearlClient:
    import time

    def sleep(s: float) -> None:
        sleeps.append(s)
        time.sleep(s)

    return PearlClient(config=config, sleep=sleep)


@pytest.fixture
async def aclient(config, sleeps):
    import asyncio

    async def sleep(s: float) -> None:
        sleeps.append(s)
        await asyncio.sleep(s)

    async with AsyncPearlClient(config=config, sleep=sleep) as c:
        yield c
