"""Client configuration: where PEARL is, how long to wait, how to back off.

One frozen dataclass holds every default so the sync and asyncio clients behave the
same. The admin token is excluded from ``repr`` (configs end up in logs and tracebacks)
and falls back to ``PEARL_ADMIN_TOKEN``, the variable the router itself reads.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Mapping

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
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not (is_seconds(self.timeout_s) and is_seconds(self.wait_timeout_s)):
            raise ValueError(f"timeout_s and wait_timeout_s must be positive, finite numbers of seconds, "
                             f"got {self.timeout_s!r} and {self.wait_timeout_s!r}")
        if not isinstance(self.backoff_s, tuple) or not all(is_seconds(d) or d == 0 for d in self.backoff_s):
            raise ValueError(f"backoff_s must be a tuple of delays >= 0 in seconds, got {self.backoff_s!r}")
        for name, value in (("admin_token", self.admin_token), ("api_key", self.api_key)):
            if value is not None and (not value or "\n" in value or "\r" in value):
                raise ValueError(f"{name} must be a non-empty single-line string")

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")


def is_seconds(value: object) -> bool:
    """A positive, finite number of seconds (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


def resolve_config(base_url: str | None = None, *, admin_token: str | None = None,
                   config: ClientConfig | None = None,
                   env: Mapping[str, str] | None = None) -> ClientConfig:
    """Explicit arguments win over ``config``, which wins over the environment."""
    env = os.environ if env is None else env
    cfg = config or ClientConfig(base_url=env.get(URL_ENV, DEFAULT_URL))
    cfg = replace(
        cfg,
        base_url=base_url or cfg.base_url,
        admin_token=admin_token or cfg.admin_token or env.get(TOKEN_ENV) or None,
        api_key=cfg.api_key or env.get(API_KEY_ENV) or None,
    )
    cfg.validate()
    return cfg
