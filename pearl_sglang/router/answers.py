"""What a client gets for each failure, in one table.

The error middleware answers with it, and a stream whose head is already sent ends with
its event. A router error is its own JSON; a worker's 4xx (``WorkerRejected``) goes back
as the worker sent it; any other worker failure that reaches a client (the dispatcher
retried the retryable ones first) is a 502. The control plane's errors map onto router
errors in ``server.control_routes.ANSWERS``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from pearl_sglang.router.errors import RouterError, UpstreamFailed
from pearl_sglang.workers.errors import WorkerError, WorkerRejected


@dataclass(frozen=True)
class Answer:
    status: int
    document: dict[str, Any] | None = None  # the router's own JSON answer
    raw: bytes = b""                         # or a worker's bytes, passed on
    content_type: str = "application/json"

    def response(self) -> web.Response:
        if self.document is not None:
            return web.json_response(self.document, status=self.status)
        return web.Response(status=self.status, body=self.raw, content_type=self.content_type.split(";")[0])

    def body(self) -> bytes:
        """The answer's bytes, as ``response()`` sends them."""
        return json.dumps(self.document).encode() if self.document is not None else self.raw

    def event(self) -> Any:
        """The error event that ends a stream already under way."""
        if self.document is not None:
            return self.document
        try:
            return json.loads(self.raw)
        except ValueError:
            return {"error": {"message": self.raw.decode(errors="replace"), "code": self.status}}


def _router_error(e: RouterError) -> Answer:
    return Answer(e.status, e.body())


def _passed_on(e: WorkerRejected) -> Answer:
    return Answer(e.status, raw=e.body, content_type=e.content_type)


def _upstream(e: WorkerError) -> Answer:
    return _router_error(UpstreamFailed(str(e)))


# Most specific first: the first class that matches answers.
ANSWERS: tuple[tuple[type[Exception], Callable[[Any], Answer]], ...] = (
    (RouterError, _router_error),
    (WorkerRejected, _passed_on),
    (WorkerError, _upstream),
)


def answer_for(error: Exception) -> Answer | None:
    for error_class, answer in ANSWERS:
        if isinstance(error, error_class):
            return answer(error)
    return None
