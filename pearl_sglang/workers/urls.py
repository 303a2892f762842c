"""A worker's address as an operator or a framework gives it: checked once where it enters
(the attach flags, the worker API), so a malformed one is refused with its reason instead
of becoming a worker that is forever down."""
from __future__ import annotations

from urllib.parse import urlsplit


def check_worker_url(url: str) -> None:
    """Raise ``ValueError`` naming what is wrong with ``url``."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"worker URL must start with http:// or https://: {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # raises for a port out of range or not a number
    except ValueError as e:
        raise ValueError(f"worker URL {url!r} is malformed: {e}") from None
    if not parts.hostname or any(c.isspace() for c in parts.netloc):
        raise ValueError(f"worker URL has no host: {url!r}")


def check_port(port: int, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{what} must be in [1, 65535], got {port!r}")
