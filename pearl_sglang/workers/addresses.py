"""Addresses as operators and frameworks give them (a worker's URL, a bootstrap port, the
host workers start on, a weight group's rendezvous address): checked by shape where they
enter, before anything resolves or dials them, so a malformed one is refused with its
reason instead of becoming a worker that is forever down."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

# A host name, an IPv4 address or an IPv6 one (bracketed or not); nothing with spaces,
# control characters or a scheme.
_HOST = re.compile(r"[A-Za-z0-9._:\[\]-]{1,253}")


def is_host(value: Any) -> bool:
    return isinstance(value, str) and _HOST.fullmatch(value) is not None


def check_worker_url(url: str) -> None:
    """Raise ``ValueError`` naming what is wrong with ``url``."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"worker URL must start with http:// or https://: {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # raises for a port out of range or not a number
    except ValueError as e:
        raise ValueError(f"worker URL {url!r} is malformed: {e}") from None
    if not is_host(parts.hostname):
        raise ValueError(f"worker URL has no host: {url!r}")


def check_port(port: int, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{what} must be in [1, 65535], got {port!r}")
