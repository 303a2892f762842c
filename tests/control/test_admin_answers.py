"""The admin API answers each control-plane error with one status and ``kind``, read from
one table (``server.control_routes.ANSWERS``); what is not in the table is not turned
into a client error."""
from __future__ import annotations

import asyncio

import pytest

from pearl_sglang.control.idempotency import RequestIdReused
from pearl_sglang.core.errors import OutOfOrder
from pearl_sglang.control.weight_group import (GroupExists, GroupInitFailed, InvalidGroupRequest,
                                               MembershipChanged, UnknownGroup)
from pearl_sglang.control.weight_pushes import NoActiveWorker
from pearl_sglang.core.errors import InvalidTransition
from pearl_sglang.server.control_routes import GatewayTimeout, _run, answer_for


@pytest.mark.parametrize("error, status, kind", [
    (OutOfOrder("x"), 409, "out_of_order"),
    (RequestIdReused("x"), 409, "request_id_reused"),
    (NoActiveWorker("x"), 503, "no_active_worker"),
    (InvalidTransition("x"), 409, "invalid_transition"),
    (InvalidGroupRequest("x"), 400, "invalid_request_error"),
    (UnknownGroup("x"), 404, "unknown_weight_group"),
    (MembershipChanged("x"), 409, "weight_group_membership"),
    (GroupExists("x"), 409, "weight_group_exists"),
    (GroupInitFailed("x"), 502, "weight_group_init_failed"),
])
async def test_each_control_error_has_one_answer(error, status, kind):
    answer = answer_for(error)
    assert (answer.status, answer.kind, answer.message) == (status, kind, "x")

    async def fails():
        raise error

    with pytest.raises(type(answer)) as raised:
        await _run(fails())
    assert raised.value.kind == kind and raised.value.__cause__ is error


async def test_a_deadline_is_a_gateway_timeout_and_other_errors_pass_through():
    with pytest.raises(GatewayTimeout, match="within 0.01s; it goes on"):
        await _run(asyncio.sleep(1), deadline_s=0.01)
    assert answer_for(ValueError("x")) is None

    async def bug():
        raise KeyError("a bug is no client error")

    with pytest.raises(KeyError):
        await _run(bug())
