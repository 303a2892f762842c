"""Client configuration: where PEARL is, how long to wait, how to back off.

One frozen dataclass holds every default so the sync and asyncio clients behave the
same. The admin token is excluded from ``repr`` (configs end up in logs and tracebacks)
and falls back to ``PEARL_ADMIN_TOKEN``, the variable the router itself reads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Mapping
from urllib.parse import urlsplit

TOKEN_ENV = "PEARL_ADMIN_TOKEN"
URL_ENV = "PEARL_URL"
API_KEY_ENV = "PEARL_API_KEY"
DEFAULT_URL = "http://127.0.0.1:30000"


@dataclass(frozen=True)
class ClientConfig:
    base_url: str = DEFAULT_URL
    admin_token: str | None = field(default=None, repr=False)
    # Calls that answer at once (train_finished, state).
    timeout_s: float = 30.0
    # Calls that wait on the cluster (train_begin drains workers, weight loads, GPU
    # join/leave); they block for as long as the reconfiguration takes.
    wait_timeout_s: float = 1800.0
    # Delays before each retry of an idempotent call; its length is the retry budget.
    backoff_s: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0)
    # Inference routes (rollout /generate) use the API key, not the admin token.
    api_key: str | None = field(default=None, repr=False)

    def validate(self) -> None:
        _check_url(self.base_url)
        if not (is_seconds(self.timeout_s) and is_seconds(self.wait_timeout_s)):
            raise ValueError(f"timeout_s and wait_timeout_s must be numbers of seconds in (0, {MAX_SECONDS:g}], "
                             f"got {self.timeout_s!r} and {self.wait_timeout_s!r}")
        if not isinstance(self.backoff_s, tuple) or not all(is_seconds(d) or d == 0 for d in self.backoff_s):
            raise ValueError(f"backoff_s must be a tuple of delays in [0, {MAX_SECONDS:g}] seconds, "
                             f"got {self.backoff_s!r}")
        for name, value in (("admin_token", self.admin_token), ("api_key", self.api_key)):
            # Sent as an HTTP header: a bearer token is visible ASCII (RFC 6750).
            if value is not None and not (isinstance(value, str) and value and value.isascii()
                                          and value.isprintable() and " " not in value):
                raise ValueError(f"{name} must be a non-empty string of visible ASCII characters "
                                 f"(no spaces, line breaks or control characters)")

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")


# Longer than any call can sensibly wait (30 days), and short enough for every clock and
# socket timeout the clients hand it to.
MAX_SECONDS = 30 * 24 * 3600.0


def is_seconds(value: object) -> bool:
    """A positive number of seconds, at most ``MAX_SECONDS`` (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= MAX_SECONDS


def _check_url(base_url: object) -> None:
    """``base_url`` as an http(s) URL both clients can send to, else ``ValueError``."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    if not base_url.isascii() or not base_url.isprintable() or " " in base_url:
        raise ValueError(f"base_url must be ASCII with no spaces, line breaks or control characters, "
                         f"got {base_url!r}")
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0..65535
        host = parts.hostname
        if host:
            host.encode("idna")
    except (ValueError, UnicodeError) as e:
        raise ValueError(f"base_url {base_url!r} is not a valid URL: {e}") from None
    if not host:
        raise ValueError(f"base_url {base_url!r} names no host")


def resolve_config(base_url: str | None = None, *, admin_token: str | None = None,
                   config: ClientConfig | None = None,
                   env: Mapping[str, str] | None = None) -> ClientConfig:
    """Explicit arguments win over ``config``, which wins over the environment."""
    env = os.environ if env is None else env
    if config is not None and not isinstance(config, ClientConfig):
        raise ValueError(f"config must be a ClientConfig, got {type(config).__name__}")
    cfg = config if config is not None else ClientConfig(base_url=env.get(URL_ENV, DEFAULT_URL))
    cfg = replace(
        cfg,
        base_url=base_url or cfg.base_url,
        admin_token=admin_token or cfg.admin_token or env.get(TOKEN_ENV) or None,
        api_key=cfg.api_key or env.get(API_KEY_ENV) or None,
    )
    cfg.validate()
    return cfg
