"""Request limits the router enforces before any worker sees a request.

Each limit has a name; a request over it gets a 4xx whose error ``type`` is
``limit_<name>`` so clients and operators can tell which one was hit.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024
    max_batch_size: int = 512
    max_n: int = 64
    max_new_tokens: int = 131072
    max_streams_per_client: int = 4096
    max_rid_length: int = 256
    # Nesting of a JSON body (an object in a list is depth 2). No SGLang or OpenAI field
    # nests deeper than a tool's JSON schema; deeper bodies only serve to exhaust the
    # recursion of whoever encodes them next.
    max_json_depth: int = 64

    def validate(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"limit {f.name} must be >= 1")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("request limits")
        for f in fields(Limits):
            group.add_argument(f"--limit-{f.name.replace('_', '-')}", dest=f"limit_{f.name}",
                               type=int, default=f.default)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "Limits":
        return cls(**{f.name: getattr(args, f"limit_{f.name}") for f in fields(cls)})


def decoded_too_deep(raw: bytes, value: object, limit: int) -> bool:
    """``json_depth_exceeds(value, limit)`` for ``value`` decoded from ``raw``. Every level
    opens with a bracket of its own, so a text with at most ``limit`` of them (any
    ordinary request) is answered by counting bytes, without walking the value."""
    return raw.count(b"[") + raw.count(b"{") > limit and json_depth_exceeds(value, limit)


def json_depth_exceeds(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests deeper than ``limit``; iterative, and a list of
    scalars (a long ``input_ids``) is skipped at C speed."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        kinds = set(map(type, children))
        if not (dict in kinds or list in kinds):
            continue
        if depth >= limit:
            return True
        stack.extend((c, depth + 1) for c in (node.values() if isinstance(node, dict) else node)
                     if isinstance(c, (dict, list)))
    return False
