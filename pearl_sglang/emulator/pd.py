"""PD rendezvous: how an emulated decode finds the prefill that holds its KV.

SGLang's decode connects to the prefill's bootstrap server (host, port) and registers
for a room; the prefill sends the KV once its prefill is done and the decode is ready.
Engines see only the ``Rendezvous`` protocol.  ``PDRegistry`` implements it in-process
(benchmarks, tests); ``http_bootstrap`` implements it across processes over HTTP.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .request import KVPayload

if TYPE_CHECKING:
    from .engine import Engine


class KVSink(Protocol):
    def kv_ready(self, payload: KVPayload) -> None: ...
    def kv_failed(self, message: str) -> None: ...


class Rendezvous(Protocol):
    """How a decode engine reaches the prefill serving a bootstrap address."""

    def bind(self, host: str, port: int, engine: "Engine") -> None: ...
    def unbind(self, host: str, port: int, engine: "Engine") -> None: ...
    def connect(self, host: str, port: int, room: int, sink: KVSink) -> None: ...
    def cancel(self, host: str, port: int, room: int) -> None: ...


class PDRegistry:
    """In-process rendezvous: bootstrap addresses map to engines in the same process."""

    def __init__(self) -> None:
        self._by_addr: dict[tuple[str, int], "Engine"] = {}

    def bind(self, host: str, port: int, engine: "Engine") -> None:
        key = (host, port)
        other = self._by_addr.get(key)
        if other is not None and other is not engine:
            raise ValueError(f"bootstrap address {host}:{port} already bound")
        self._by_addr[key] = engine

    def unbind(self, host: str, port: int, engine: "Engine") -> None:
        if self._by_addr.get((host, port)) is engine:
            del self._by_addr[(host, port)]

    def connect(self, host: str, port: int, room: int, sink: KVSink) -> None:
        engine = self._by_addr.get((host, port))
        if engine is None:
            sink.kv_failed(f"bootstrap server {host}:{port} unreachable")
            return
        engine.accept_decode(room, sink)

    def cancel(self, host: str, port: int, room: int) -> None:
        engine = self._by_addr.get((host, port))
        if engine is not None:
            engine.cancel_decode(room)
