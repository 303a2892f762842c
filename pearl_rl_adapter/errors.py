"""Typed errors of PEARL's admin API, as a trainer sees them.

The class says what the caller can do: ``PearlUnavailable`` may go away if the call is
made again later (the client already retried idempotent calls), ``PearlRejected`` and its
subclasses will not (the request itself is wrong or out of order), and ``PearlTimeout``
leaves the outcome unknown: the router may still act, so only a call with the same
``request_id`` is safe to repeat. Router answers keep the router's own message and type
(``{"error": {"message", "type", "code"}}``) so a training log shows what PEARL said.
"""
from __future__ import annotations

from typing import ClassVar


class PearlError(Exception):
    """Any failure of a call to PEARL's control plane."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | None = None,
                 error_type: str | None = None, request_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint
        self.status = status
        self.error_type = error_type
        self.request_id = request_id
        self.attempts = 1

    def __str__(self) -> str:
        where = f"{self.endpoint}: " if self.endpoint else ""
        detail = [f"HTTP {self.status}"] if self.status is not None else []
        if self.error_type:
            detail.append(self.error_type)
        if self.attempts > 1:
            detail.append(f"after {self.attempts} attempts")
        return f"{where}{self.message}" + (f" ({', '.join(detail)})" if detail else "")


class PearlUnavailable(PearlError):
    """PEARL could not be reached or answered 5xx; trying again later may succeed."""

    retryable = True


class PearlTimeout(PearlError):
    """No answer within the client's timeout. The router may have acted: repeat the call
    only with the same ``request_id`` (``err.request_id``), which makes it idempotent."""


class PearlProtocolError(PearlError):
    """PEARL answered something that is not the admin API's JSON (wrong URL, proxy page)."""


class PearlRejected(PearlError):
    """PEARL answered 4xx: this request will fail the same way if repeated."""


class PearlAuthError(PearlRejected):
    """401: missing or wrong admin token (``PEARL_ADMIN_TOKEN``), or admin API disabled."""


class PearlConflict(PearlRejected):
    """409: the call is out of order (``train_begin`` twice, ``train_finished`` first)."""


class PearlClientClosed(PearlError, RuntimeError):
    """The client was closed (``aclose()``) and is used again: open a new one. Nothing was
    sent. (A ``RuntimeError`` too, as a closed aiohttp session's is.)"""
