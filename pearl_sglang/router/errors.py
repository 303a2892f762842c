"""Typed errors of the router's data path, each with the HTTP status a client sees.

``RouterError`` subclasses become JSON ``{"error": {"message", "type", "code"}}``
replies. A failed call to a worker is a ``workers.errors.WorkerError``: the dispatcher
moves a retryable one elsewhere, and ``answers.py`` says what the client gets for each.
"""
from __future__ import annotations

from typing import Any


class RouterError(Exception):
    status = 500
    kind = "internal_error"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind:
            self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


class BadRequest(RouterError):
    status = 400
    kind = "invalid_request_error"


class Unauthorized(RouterError):
    status = 401
    kind = "unauthorized"


class NotFound(RouterError):
    status = 404
    kind = "not_found"


class RequestTimeout(RouterError):
    status = 408
    kind = "body_timeout"


class PayloadTooLarge(RouterError):
    status = 413
    kind = "limit_max_body_bytes"


class TooManyStreams(RouterError):
    status = 429
    kind = "limit_max_streams_per_client"


class RequestAborted(RouterError):
    """Aborted (``/abort_request``, or the router stopping) before any of its answer was
    sent, with no partial output to return (gRPC's CANCELLED maps to 499 too)."""

    status = 499
    kind = "request_aborted"


class Conflict(RouterError):
    status = 409
    kind = "conflict"


class ServiceUnavailable(RouterError):
    status = 503
    kind = "service_unavailable"


class UpstreamFailed(RouterError):
    status = 502
    kind = "upstream_failed"
