"""Host names and addresses given in configs and admin calls (a launcher's host, a weight
group's rendezvous address): checked by shape before anything resolves or dials them."""
from __future__ import annotations

import re
from typing import Any

# A host name, an IPv4 address or an IPv6 one (bracketed or not); nothing with spaces,
# control characters or a scheme.
_HOST = re.compile(r"[A-Za-z0-9._:\[\]-]{1,253}")


def is_host(value: Any) -> bool:
    return isinstance(value, str) and _HOST.fullmatch(value) is not None
