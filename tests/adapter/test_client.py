"""Both admin clients against a real in-process control plane."""
from __future__ import annotations

import asyncio
import inspect
import logging

import pytest

from pearl_rl_adapter import (AsyncPearlClient, ClientConfig, DistributedWeights, PearlAuthError, PearlClient,
                              PearlClientClosed, PearlConflict, PearlError, PearlProtocolError, PearlRejected,
                              PearlTimeout, PearlUnavailable)
from tests.adapter.conftest import BACKOFF
from tests.adapter.fake_pearl import TOKEN
from tests.adapter.raw_server import RawAnswer


@pytest.fixture(params=["sync", "async"])
def call(request, client, aclient):
    """``await call("train_begin", 3)`` on either client (sync runs in a worker thread)."""
    async def invoke(name, *args, **kwargs):
        if request.param == "sync":
            return await asyncio.to_thread(getattr(client, name), *args, **kwargs)
        return await getattr(aclient, name)(*args, **kwargs)
    return invoke


# ---- every endpoint --------------------------------------------------------------------

async def test_endpoints_parse_answers(call, fake):
    begun = await call("train_begin", 3, deadline_s=30)
    assert (begun.step, begun.returned_gpus, begun.duplicate) == (3, ("node1:0",), False)
    assert fake.calls[-1].body["deadline_s"] == 30.0
    finished = await call("train_finished", 3)
    assert finished.borrowing and finished.reason == "benefit"
    disk = await call("update_weights_from_disk", version="v7", model_path="/ckpt/7")
    assert disk.version == disk.latest == "v7" and not disk.failed
    group = await call("init_weight_group", group_name="g", master_address="10.0.0.1", master_port=29500,
                       backend="gloo")
    assert group.world_size == 3 and [(m.slot, m.rank_offset) for m in group.members] == [(0, 1), (1, 2)]
    assert fake.calls[-1].body == {"action": "init", "group_name": "g", "master_address": "10.0.0.1",
                                   "master_port": 29500, "backend": "gloo",
                                   "request_id": fake.calls[-1].body["request_id"]}
    dist = DistributedWeights(names=["w"], dtypes=["bfloat16"], shapes=[[2, 2]], group_name="g")
    await call("update_weights_from_distributed", version="v8", distributed=dist, model_path="/ckpt/8")
    assert fake.calls[-1].body["distributed"] == {"group_name": "g", "names": ["w"], "dtypes": ["bfloat16"],
                                                  "shapes": [[2, 2]]}
    assert fake.calls[-1].body["model_path"] == "/ckpt/8"
    destroyed = await call("destroy_weight_group", "g")
    assert destroyed.members == {"0": "ok", "1": "ok"} and fake.calls[-1].body["action"] == "destroy"
    joined = await call("join_gpus", ["node3:0"], hosts={"node3": "10.0.0.3"})
    assert joined.admitted == ("slot-node3:0",) and not joined.cancelled
    left = await call("leave_gpus", ["node3:0"], deadline_s=10)
    assert left.removed == ("slot-node3:0",)
    assert (await call("state"))["workers"][0]["role"] == "decode"
    posts = [c for c in fake.calls if c.path != "/pearl/state"]
    assert all(c.body["request_id"] for c in posts)
    assert len({c.body["request_id"] for c in posts}) == len(posts)


def test_sync_and_async_methods_have_the_same_signatures():
    public = [n for n in vars(PearlClient) if not n.startswith("_") and callable(getattr(PearlClient, n))]
    for name in set(public) - {"close"}:
        sync, async_ = (inspect.signature(getattr(cls, name)).parameters for cls in (PearlClient, AsyncPearlClient))
        assert sync == async_, name


# ---- typed errors carry the router's message -------------------------------------------

@pytest.mark.parametrize("status,cls", [(400, PearlRejected), (404, PearlRejected), (409, PearlConflict),
                                        (413, PearlRejected), (500, PearlUnavailable)])
async def test_router_errors_are_typed_with_the_routers_message(call, fake, status, cls):
    fake.fail("/train_begin", status, "the router says no", "some_kind", times=5)
    with pytest.raises(cls) as info:
        await call("train_begin", 1)
    err = info.value
    assert (err.status, err.message, err.error_type) == (status, "the router says no", "some_kind")
    assert "the router says no" in str(err) and err.request_id.startswith("train_begin-")
    assert len(fake.attempts) == 1  # neither 4xx nor a plain 500 is retried


async def test_out_of_order_calls_are_conflicts(call):
    with pytest.raises(PearlConflict, match="without train_begin"):
        await call("train_finished", 4)


async def test_wrong_token_is_an_auth_error(fake, config):
    bad = ClientConfig(base_url=fake.url, admin_token="wrong", backoff_s=BACKOFF)
    with pytest.raises(PearlAuthError, match="admin token") as info:
        PearlClient(config=bad).state()
    assert info.value.status == 401 and isinstance(info.value, PearlRejected)
    async with AsyncPearlClient(config=bad) as c:
        with pytest.raises(PearlAuthError):
            await c.state()


async def test_non_json_answer_is_a_protocol_error(call, fake):
    fake.fail("/pearl/state", 200, raw=b"<html>proxy login</html>")
    with pytest.raises(PearlProtocolError, match="proxy login"):
        await call("state")


# ---- retries: only where safe, same request_id -----------------------------------------

async def test_dropped_connections_are_retried_with_the_same_request_id(call, fake, sleeps):
    fake.drop("/train_begin", 2)
    begun = await call("train_begin", 5)
    assert begun.step == 5
    ids = [a.body["request_id"] for a in fake.attempts]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert sleeps == list(BACKOFF[:2])


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_gateway_errors_are_retried_then_surface_as_unavailable(call, fake, sleeps, status):
    fake.fail("/train_finished", status, "cluster busy", "service_unavailable", times=10)
    with pytest.raises(PearlUnavailable, match="cluster busy") as info:
        await call("train_finished", 1)
    assert info.value.attempts == len(BACKOFF) + 1 and info.value.retryable
    assert len(fake.attempts) == len(BACKOFF) + 1 and sleeps == list(BACKOFF)
    assert len({a.body["request_id"] for a in fake.attempts}) == 1


async def test_a_retry_after_the_router_acted_gets_the_first_answer(call, fake):
    await call("train_begin", 2)
    first = fake.calls[-1].body["request_id"]
    again = await call("train_begin", 2, request_id=first)  # what a retry of a lost answer sends
    assert again.duplicate and fake.open_step == 2


async def test_unreachable_router_is_unavailable_after_retries(sleeps):
    cfg = ClientConfig(base_url="http://127.0.0.1:9", admin_token=TOKEN, backoff_s=(0.0, 0.0))
    with pytest.raises(PearlUnavailable, match="cannot reach PEARL") as info:
        PearlClient(config=cfg, sleep=sleeps.append).state()
    assert info.value.attempts == 3
    async with AsyncPearlClient(config=cfg) as c:
        with pytest.raises(PearlUnavailable):
            await c.train_finished(1)


async def test_timeouts_are_not_retried_and_keep_the_request_id(call, fake):
    fake.delay("/train_begin", 1.0)
    with pytest.raises(PearlTimeout) as info:
        await call("train_begin", 1, timeout_s=0.2)
    assert len(fake.attempts) == 1 and info.value.request_id.startswith("train_begin-")
    assert not info.value.retryable


# ---- the admin token -------------------------------------------------------------------

async def test_token_is_sent_and_never_shown(call, fake, client, aclient, caplog):
    caplog.set_level(logging.DEBUG)
    fake.fail("/train_finished", 503, times=1)
    fake.fail("/train_begin", 400, "bad step", times=1)
    with pytest.raises(PearlError) as info:
        await call("train_begin", 1)
    await call("state")
    assert fake.attempts[-1].headers["Authorization"] == f"Bearer {TOKEN}"
    shown = [repr(client), str(client), repr(aclient), repr(client.config), str(client.config),
             str(info.value), repr(info.value), caplog.text]
    assert not any(TOKEN in s for s in shown)


def test_token_comes_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("PEARL_ADMIN_TOKEN", TOKEN)
    c = PearlClient(fake.url)
    assert c.state()["workers"] and TOKEN not in repr(c)
    assert PearlClient(fake.url, admin_token="explicit").config.admin_token == "explicit"


def test_config_is_validated():
    with pytest.raises(ValueError):
        ClientConfig(base_url="pearl:30000").validate()
    with pytest.raises(ValueError):
        PearlClient("http://x:1", admin_token="a\nb")
    with pytest.raises(ValueError):
        PearlClient("http://x:1").train_begin(-1)


async def test_closed_async_client_refuses_calls(config):
    c = AsyncPearlClient(config=config)
    await c.state()
    await c.aclose()
    with pytest.raises(PearlClientClosed, match="closed") as info:
        await c.state()
    assert isinstance(info.value, RuntimeError)


# ---- found by fuzzing the adapter ------------------------------------------------------

@pytest.mark.parametrize("hold_s,error", [(0.0, PearlUnavailable), (3.0, PearlTimeout)])
def test_an_error_answer_whose_body_breaks_or_stalls_is_a_typed_error(hold_s, error):
    server = RawAnswer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100\r\n\r\n", b'{"error": {"mess', hold_s)
    try:
        cfg = ClientConfig(base_url=server.url, admin_token=TOKEN, timeout_s=0.5, backoff_s=())
        with pytest.raises(error):
            PearlClient(config=cfg).state()
    finally:
        server.close()


def test_one_async_client_serves_one_event_loop_after_another(config, fake, caplog):
    from pearl_rl_adapter.rollout import RolloutClient

    caplog.set_level(logging.ERROR, logger="asyncio")
    admin, rollout = AsyncPearlClient(config=config), RolloutClient(config=config)
    for _ in range(3):  # a blocking driver: asyncio.run per call
        assert asyncio.run(admin.state())["workers"]
        assert asyncio.run(rollout.generate([1, 2, 3], {"max_new_tokens": 2})).token_ids
    asyncio.run(admin.aclose())
    asyncio.run(rollout.aclose())
    import gc
    gc.collect()
    assert "Unclosed" not in caplog.text  # no session or connector left open on a live loop


@pytest.mark.parametrize("raw", [b'{"step": 1, "elapsed_s": ' + b"9" * 400 + b"}", b"[" * 100_000 + b"]" * 100_000])
def test_an_answer_no_number_or_depth_can_hold_is_a_protocol_error(config, raw):
    from pearl_rl_adapter import protocol

    with pytest.raises(PearlProtocolError):
        protocol.decode(protocol.train_begin(config, 1), 200, raw)


@pytest.mark.parametrize("make", [
    lambda c: c.train_begin(1, deadline_s=float("inf")),
    lambda c: c.leave_gpus(["n:0"], deadline_s=float("nan")),
    lambda c: c.update_weights_from_disk(version=None, model_path="/ckpt"),
    lambda c: c.update_weights_from_disk(version="v1", model_path=""),
    lambda c: c.destroy_weight_group(None),
    lambda c: c.state(timeout_s=-1),
])
def test_arguments_no_call_can_carry_are_value_errors(make):
    with pytest.raises(ValueError):
        make(PearlClient("http://127.0.0.1:9", admin_token=TOKEN))


@pytest.mark.parametrize("fields", [{"base_url": 5}, {"timeout_s": "3"}, {"wait_timeout_s": float("inf")},
                                    {"backoff_s": None}, {"backoff_s": (0.1, -1)}, {"timeout_s": True}])
def test_a_config_no_client_can_use_is_a_value_error(fields):
    with pytest.raises(ValueError):
        ClientConfig(**fields).validate()
