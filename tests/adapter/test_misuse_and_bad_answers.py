"""Found by fuzzing the adapter: every call succeeds or raises the adapter's typed error
(or ``ValueError`` for arguments no call can carry), the admin token never shows and
never leaves for another host, and a timed-out ``train_begin`` does not wedge the steps
after it."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest

from pearl_rl_adapter import (AsyncPearlClient, ClientConfig, DistributedWeights, PearlClient, PearlClientClosed,
                              PearlError, PearlProtocolError, PearlTimeout, PearlUnavailable, RolloutClient,
                              TurnCounter, tag_headers)
from pearl_rl_adapter import protocol
from pearl_rl_adapter.rollout import parse_generate
from pearl_rl_adapter.shims import slime, verl
from pearl_rl_adapter.shims._common import StepBracket, WeightDirs, load_function
from pearl_rl_adapter.shims.router_abort import abort_through_router
from tests.adapter.fake_pearl import TOKEN
from tests.adapter.raw_server import RawAnswer

SECRET = "SUPER-SECRET-ADMIN-TOKEN"


def _cfg(url: str, **kw) -> ClientConfig:
    return ClientConfig(**{"base_url": url, "admin_token": SECRET, "api_key": SECRET, "timeout_s": 2.0,
                           "wait_timeout_s": 2.0, "backoff_s": (0.01,), **kw})


def _sync(cfg: ClientConfig, name: str, *args, **kw):
    return getattr(PearlClient(config=cfg), name)(*args, **kw)


def _async(cfg: ClientConfig, name: str, *args, **kw):
    async def run():
        async with AsyncPearlClient(config=cfg) as c:
            return await getattr(c, name)(*args, **kw)
    return asyncio.run(run())


def _rollout(cfg: ClientConfig, *_args, **_kw):
    async def run():
        c = RolloutClient(config=cfg)
        try:
            return await c.generate([1, 2], {"max_new_tokens": 2})
        finally:
            await c.aclose()
    return asyncio.run(run())


CLIENTS = [pytest.param(_sync, id="sync"), pytest.param(_async, id="async")]


# ---- the token stays with PEARL ----------------------------------------------------------

@pytest.mark.parametrize("send", CLIENTS)
@pytest.mark.parametrize("head", [b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n{}",
                                  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}"],
                         ids=["status-line", "content-length", "chunk-size"])
def test_a_malformed_answer_never_shows_the_token(send, head, caplog):
    # aiohttp's errors carry the request's headers in their repr, which the message used.
    caplog.set_level(logging.DEBUG)
    shown = []
    with RawAnswer(head) as server:
        try:
            send(_cfg(server.url), "state")
        except PearlError as e:
            shown += [str(e), repr(e)]
    # urllib reads a body with a bad length to its end instead, which is no error here.
    assert shown or (send is _sync and b"Content-Length: x" in head)
    assert not any(SECRET in text for text in (*shown, caplog.text))


@pytest.mark.parametrize("send", [*CLIENTS, pytest.param(_rollout, id="rollout")])
def test_redirects_are_answers_that_are_not_followed(send):
    # A 302 to another origin sent the token there, and the POST came back as a GET that
    # "succeeded" without PEARL ever seeing it.
    with RawAnswer(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"step\": 1}\n") as elsewhere, \
            RawAnswer(b"HTTP/1.1 302 Found\r\nLocation: " + elsewhere.url.encode()
                      + b"/train_begin\r\nContent-Length: 0\r\n\r\n") as pearl:
        with pytest.raises(PearlProtocolError, match="redirect"):
            send(_cfg(pearl.url), "train_begin", 1)
        time.sleep(0.1)
        assert elsewhere.received == [] and len(pearl.received) == 1


# ---- answers that are not what they should be ---------------------------------------------

@pytest.mark.parametrize("answer", [{"error": {"message": "worker lost", "type": "internal"}}, {}, {"status": "ok"},
                                    {"meta_info": [], "output_ids": [1]}, {"output_ids": "abc"},
                                    {"output_ids": [1, None]}, {"meta_info": {"output_token_logprobs": [5]}}])
def test_a_generate_answer_that_is_not_a_generation_is_a_protocol_error(answer):
    # {...} without output ids was taken as an empty generation: the turn was lost silently.
    call = protocol.Call("POST", "/generate", {}, 1.0, parse_generate, admin=False)
    with pytest.raises(PearlProtocolError):
        protocol.decode(call, 200, json.dumps(answer).encode())


def test_an_error_answer_no_depth_can_hold_is_still_typed_by_its_status():
    call = protocol.state(ClientConfig())
    assert isinstance(protocol.error_for(call, 500, b"[" * 100_000 + b"]" * 100_000), PearlUnavailable)


def test_the_blocking_client_ends_a_trickling_answer_on_time():
    # urllib's timeout is per socket read: one byte every 0.3 s never ended (20 s at 1 s).
    with RawAnswer(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n", b"{" + b" " * 38 + b"}", trickle_s=0.3) as server:
        started = time.monotonic()
        with pytest.raises(PearlTimeout):
            _sync(_cfg(server.url, timeout_s=1.0), "state")
        assert time.monotonic() - started < 2.5


# ---- one client, several event loops ------------------------------------------------------

def test_one_async_client_serves_two_event_loops_at_once(config, fake, caplog):
    # Each call replaced the other loop's session under its request (AttributeError from
    # aiohttp's internals, unclosed connectors).
    caplog.set_level(logging.ERROR, logger="asyncio")
    client, errors = AsyncPearlClient(config=config), []

    def loop_calls() -> None:
        async def calls() -> None:
            for _ in range(40):
                await client.state()
        try:
            asyncio.run(calls())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=loop_calls) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    asyncio.run(client.aclose())
    import gc
    gc.collect()
    assert errors == [] and "Unclosed" not in caplog.text


def test_aclose_closes_the_session_of_another_running_loop(config, fake):
    client, other = AsyncPearlClient(config=config), asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(client.state(), other).result(10)
        session = next(iter(client._session._sessions.values()))
        asyncio.run(client.aclose())
        assert session.closed
        with pytest.raises(PearlClientClosed):
            asyncio.run_coroutine_threadsafe(client.state(), other).result(10)
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


def test_a_closed_rollout_client_refuses_calls_instead_of_opening_a_new_session(config, fake):
    async def run():
        c = RolloutClient(config=config)
        await c.generate([1], {"max_new_tokens": 1})
        await c.aclose()
        await c.generate([1], {"max_new_tokens": 1})
    with pytest.raises(PearlClientClosed):
        asyncio.run(run())


# ---- a train_begin that timed out ---------------------------------------------------------

def test_a_timed_out_train_begin_does_not_wedge_the_next_step(fake, config):
    from dataclasses import replace

    fake.delay("/train_begin", 0.6)  # PEARL acts on it after the client gave up
    client = PearlClient(config=replace(config, wait_timeout_s=0.2))
    with pytest.raises(PearlTimeout):
        with client.training_step(10):
            pytest.fail("the body must not run")
    fake.delays.clear()
    with client.training_step(11):
        assert fake.open_step == 11  # step 10 was closed, not left to refuse 11 with a 409
    assert fake.open_step is None


def test_a_bracket_repeats_an_unsure_begin_under_its_request_id(fake, config):
    from dataclasses import replace

    fake.delay("/train_begin", 0.6)
    bracket = StepBracket(PearlClient(config=replace(config, wait_timeout_s=0.2)))
    with pytest.raises(PearlTimeout) as info:
        bracket.begin(10)
    time.sleep(0.6)
    fake.delays.clear()
    assert bracket.begin(10) is not None  # asked again: PEARL answers the first call's outcome
    begins = [s.body for s in fake.calls if s.path == "/train_begin"]
    assert [b["request_id"] for b in begins] == [info.value.request_id] * 2
    bracket.finish()
    assert fake.open_step is None and bracket.open_step is None


def test_a_bracket_begins_the_next_step_after_an_unsure_begin_that_never_happened(fake, config):
    from dataclasses import replace

    fake.delay("/train_begin", 0.6)
    fake.fail("/train_begin", 503, "draining failed")  # after the client gave up: never began
    bracket = StepBracket(PearlClient(config=replace(config, wait_timeout_s=0.2, backoff_s=())))
    with pytest.raises(PearlTimeout):
        bracket.begin(10)
    time.sleep(0.6)
    fake.delays.clear()
    assert bracket.begin(11).step == 11 and fake.open_step == 11


# ---- arguments no call can carry ----------------------------------------------------------

@pytest.mark.parametrize("fields", [
    {"admin_token": 5}, {"api_key": 5}, {"admin_token": "токен"}, {"admin_token": "a\x00b"}, {"admin_token": "a b"},
    {"base_url": "http://127.0.0.1:1\n"}, {"base_url": "http://" + "a" * 64 + ".example:1"},
    {"base_url": "http://h:99999"}, {"base_url": "http://:1"}, {"timeout_s": 1e300}, {"backoff_s": (1e300,)},
])
def test_a_config_no_client_can_send_with_is_a_value_error(fields):
    with pytest.raises(ValueError):
        ClientConfig(**fields).validate()


@pytest.mark.parametrize("config", ["http://h:1", {}, 5])
def test_a_config_that_is_not_one_is_a_value_error(config):
    with pytest.raises(ValueError, match="ClientConfig"):
        PearlClient(config=config)


_D = DistributedWeights


@pytest.mark.parametrize("make", [
    lambda c: c.init_weight_group(group_name="g", master_address="h", master_port=None),
    lambda c: c.init_weight_group(group_name="g", master_address="h", master_port=1.9),
    lambda c: c.init_weight_group(group_name="g", master_address="h", master_port=True),
    lambda c: c.init_weight_group(group_name="g", master_address="h", master_port=70000),
    lambda c: c.join_gpus(5), lambda c: c.join_gpus(b"ab"), lambda c: c.join_gpus([1, 2]),
    lambda c: c.join_gpus(["n:0"], hosts=5), lambda c: c.join_gpus(["n:0"], hosts=[1, 2]),
    lambda c: c.train_begin(1, request_id=object()), lambda c: c.train_begin(1, request_id=""),
    lambda c: c.update_weights_from_disk(version="v", model_path="/m", load_format=object()),
    lambda c: c.update_weights_from_distributed(version="v", distributed=None),
    lambda c: c.update_weights_from_distributed(version="v", distributed=_D(["a"], ["f"], None, "g")),
    lambda c: c.update_weights_from_distributed(version="v", distributed=_D("ab", ["f", "f"], [[1], [1]], "g")),
    lambda c: c.update_weights_from_distributed(version="v", distributed=_D(["a"], ["f"], [[None]], "g")),
    lambda c: c.update_weights_from_distributed(version="v", distributed=_D(["a"], ["f"], [5], "g")),
    lambda c: c.state(timeout_s=0),
])
def test_arguments_no_admin_call_can_carry_are_value_errors(make):
    with pytest.raises(ValueError):
        make(PearlClient("http://127.0.0.1:9", admin_token=TOKEN))


@pytest.mark.parametrize("make", [
    lambda c: c.generate(None, {}), lambda c: c.generate([1], None), lambda c: c.generate("123", {}),
    lambda c: c.generate([1, True], {}), lambda c: c.post_generate("str"),
    lambda c: c.post_generate({"input_ids": [1]}, headers="abc"),
])
def test_arguments_no_generate_can_carry_are_value_errors(make):
    async def run():
        c = RolloutClient("http://127.0.0.1:9")
        try:
            await make(c)
        finally:
            await c.aclose()
    with pytest.raises(ValueError):
        asyncio.run(run())


@pytest.mark.parametrize("make", [
    lambda: TurnCounter(max_trajectories=None), lambda: tag_headers("é", 0), lambda: tag_headers("任务", 0),
    lambda: verl.sglang_sampling(None), lambda: WeightDirs().loaded(None), lambda: load_function("nomod_x:fn"),
    lambda: load_function("os:nonexistent_function"), lambda: load_function("os:sep"), lambda: slime.router_args(5),
    lambda: StepBracket(PearlClient("http://127.0.0.1:9")).begin(None),
    lambda: asyncio.run(abort_through_router("http://127.0.0.1:9", rids="abc")),
    lambda: asyncio.run(abort_through_router("http://127.0.0.1:9", rids=5)),
])
def test_shim_arguments_no_framework_call_can_carry_are_value_errors(make):
    with pytest.raises(ValueError):
        make()


def test_a_verl_request_without_an_id_is_a_value_error(config, fake):
    # It was tagged as trajectory "None", every such request one trajectory.
    async def run():
        rollout = RolloutClient(config=config)
        try:
            await verl.VerlRollout(rollout).generate(None, prompt_ids=[1], sampling_params={})
        finally:
            await rollout.aclose()
    with pytest.raises(ValueError, match="request_id"):
        asyncio.run(run())


# ---- aborts through the router ------------------------------------------------------------

@pytest.mark.parametrize("head,error", [
    (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno", PearlUnavailable),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>", PearlProtocolError),
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", PearlProtocolError),
])
def test_an_abort_through_the_router_fails_with_typed_errors(head, error):
    with RawAnswer(head) as server:
        with pytest.raises(error):
            asyncio.run(abort_through_router(server.url, timeout_s=2))
    with pytest.raises(PearlUnavailable):
        asyncio.run(abort_through_router("http://127.0.0.1:9", timeout_s=2))


def test_an_abort_through_the_router_keeps_to_its_timeout():
    # Each round waited up to a fixed 30 s, and the deadline was checked only between them.
    with RawAnswer(b"", hold_s=10) as server:
        started = time.monotonic()
        with pytest.raises(PearlTimeout):
            asyncio.run(abort_through_router(server.url, timeout_s=1.0))
        assert time.monotonic() - started < 3
