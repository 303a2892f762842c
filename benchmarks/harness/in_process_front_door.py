"""The replay driver's ``/generate`` into the router in the same process, without HTTP.

A replay's driver sends every turn's whole context (tens of thousands of ids) to the
router; over loopback HTTP that is JSON written by the driver, aiohttp on both sides,
and the router's parse of the ids back out of the text, about a fifth of a replay's CPU.
``InProcessFrontDoor`` hands the router the same body and headers instead: the
context array becomes checked ``EncodedIds`` that keep it (``EncodedIds.of_array``:
the router keys its blocks from the array and the in-process worker transport hands
it on, so no id text is written or parsed), and the request runs the ``/generate``
handler's own steps (``parse_generate``, ``start_runs``, ``unstreamed_answer``) with
its metrics. A router or worker error comes
back as the status and body the error middleware would have sent. What it leaves out is
HTTP itself: authentication (the caller is the harness), body size and JSON depth limits
(the body is no JSON), and watching a client connection (a cancelled turn cancels the
call, which aborts at the worker as a closed connection does).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from aiohttp import web
from multidict import CIMultiDict

from pearl_sglang.router.answers import answer_for
from pearl_sglang.router.encoded_ids import EncodedIds
from pearl_sglang.router.errors import RouterError
from pearl_sglang.router.generate_request import parse_generate
from pearl_sglang.router.inference_routes import start_runs, trajectory_headers, unstreamed_answer
from pearl_sglang.router.state import ROUTER
from pearl_sglang.workers.errors import WorkerError


def _checked_ids(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The body with a context array as checked ``EncodedIds``, and whether it is; any
    other ``input_ids`` as JSON would have decoded it, for the router's general checks."""
    ids = body.get("input_ids")
    if not isinstance(ids, np.ndarray):
        return body, False
    try:
        encoded = EncodedIds.of_array(ids)
    except ValueError:
        return {**body, "input_ids": ids.tolist()}, False
    return {**body, "input_ids": encoded}, True


class InProcessFrontDoor:
    """``FrontDoor`` (``pearl_sglang.workload.client``) of a router app in this process."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    async def post_generate(self, body: dict[str, Any], headers: Mapping[str, str]) -> tuple[int, Any]:
        st = self.app[ROUTER]
        started = st.clock.now()
        try:
            body, ids_checked = _checked_ids(body)
            call = parse_generate(body, st.config.limits, ids_checked)
            if call.stream:
                raise ValueError("the in-process front door answers whole, not as a stream")
            runs = start_runs(st, call, trajectory_headers(CIMultiDict(headers), batch=call.is_batch))
            try:
                status, answer = 200, await unstreamed_answer(runs, call.is_batch)
            finally:
                st.metrics.latency.labels("generate").observe(st.clock.now() - started)
        except (RouterError, WorkerError) as e:
            failure = answer_for(e)
            status, answer = failure.status, failure.body()
        st.metrics.requests.labels("/generate", str(status)).inc()
        return status, answer
