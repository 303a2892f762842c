"""Typed errors of the router's data path, each with the HTTP status a client sees.

Retryable worker failures (``WorkerUnavailable``, ``WorkerFailed``) are handled by the
dispatcher, which moves the request elsewhere; ``WorkerRejected`` is the worker's own
4xx and goes back to the client unchanged. ``RouterError`` subclasses become JSON
``{"error": {"message", "type", "code"}}`` replies.
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


class Conflict(RouterError):
    status = 409
    kind = "conflict"


class ServiceUnavailable(RouterError):
    status = 503
    kind = "service_unavailable"


class UpstreamFailed(RouterError):
    status = 502
    kind = "upstream_failed"


class WorkerError(Exception):
    """A call to one worker failed."""

    def __init__(self, worker_id: str, message: str) -> None:
        super().__init__(f"worker {worker_id}: {message}")
        self.worker_id = worker_id


class WorkerUnavailable(WorkerError):
    """Connection refused, reset, timed out or cut mid-stream: try another worker."""


class WorkerStalled(WorkerUnavailable):
    """The worker sent nothing on a stream for the stall bound: hung (stopped, wedged)."""


class WorkerFailed(WorkerError):
    """The worker answered 5xx or an error event: try another worker."""


class WorkerRejected(WorkerError):
    """The worker answered 4xx: the request itself is wrong; the client gets this reply."""

    def __init__(self, worker_id: str, status: int, body: bytes, content_type: str) -> None:
        super().__init__(worker_id, f"rejected with {status}")
        self.status = status
        self.body = body
        self.content_type = content_type
