"""What can go wrong in a call to one worker, split by what the caller can do about it.

* retryable: ``WorkerUnavailable`` (refused, reset, timed out, cut mid-stream; its
  ``WorkerStalled`` is a stream silent past the stall bound) and ``WorkerFailed`` (a 5xx,
  an error event, an answer of ``success: false``): another worker, or a later try, may
  succeed;
* permanent: ``WorkerRefused``, the worker cannot do what was asked, and its
  ``WorkerRejected``, the worker's own 4xx, which goes back to the client as it came.

The HTTP answers these become are in ``router.answers``.
"""
from __future__ import annotations

from typing import ClassVar


class WorkerError(Exception):
    """A call to one worker failed. ``worker`` names it (a slot or an endpoint), ``path``
    the call when known."""

    retryable: ClassVar[bool] = True

    def __init__(self, worker: str, message: str, *, path: str | None = None) -> None:
        super().__init__(f"worker {worker}: {message}" if path is None else f"{path} on {worker}: {message}")
        self.worker_id = worker
        self.path = path


class WorkerUnavailable(WorkerError):
    """Connection refused, reset, timed out or cut mid-stream: try another worker."""


class WorkerStalled(WorkerUnavailable):
    """The worker sent nothing on a stream for the stall bound: hung (stopped, wedged)."""


class WorkerFailed(WorkerError):
    """The worker answered 5xx, an error event or ``success: false``: try another worker."""


class WorkerRefused(WorkerError):
    """The worker cannot do what was asked (its configuration or the request): trying
    again, here or elsewhere, gives the same answer."""

    retryable = False


class WorkerRejected(WorkerRefused):
    """The worker answered 4xx: the request itself is wrong; the client gets this reply."""

    def __init__(self, worker: str, status: int, body: bytes, content_type: str = "application/json",
                 *, path: str | None = None) -> None:
        super().__init__(worker, f"rejected with {status}: {_text(body)}", path=path)
        self.status = status
        self.body = body
        self.content_type = content_type


def status_error(worker: str, status: int, data: bytes, content_type: str = "application/json",
                 *, path: str | None = None) -> WorkerError:
    """A worker's error answer as a typed failure: the client's own fault (4xx, except a
    timeout or throttling, which are retried elsewhere) is passed on, the rest is the worker's."""
    if 400 <= status < 500 and status not in (408, 429):
        return WorkerRejected(worker, status, data, content_type, path=path)
    return WorkerFailed(worker, f"HTTP {status}: {_text(data)}", path=path)


def _text(data: bytes) -> str:
    return data[:300].decode(errors="replace")
