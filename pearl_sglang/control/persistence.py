"""The control plane's crash-safe record: written atomically before and after every act.

One JSON document (``state.json`` in ``--state-dir``) holds the table, the latest weight
snapshot, the training/borrowing flags, where each launched worker lives (endpoint, PID)
and the *intent*: the plan being executed, written before any worker is touched and
cleared when it is done. A router killed at any moment finds on restart what it was
doing and what it had launched; ``reconcile`` then checks that against the workers
themselves instead of trusting the record. The write is a temp file, ``fsync``, atomic
``rename`` and a directory ``fsync``: a crash leaves the old document or the new one,
never a torn one.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1


@dataclass
class ControlRecord:
    table: dict[str, Any]
    snapshot: dict[str, Any]
    training: bool = False
    borrowing: bool = False
    last_step: dict[str, int | None] = field(default_factory=lambda: {"begin": None, "finished": None})
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    intent: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "table": self.table, "snapshot": self.snapshot, "training": self.training,
                "borrowing": self.borrowing, "last_step": self.last_step, "workers": self.workers,
                "intent": self.intent}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ControlRecord":
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown control record format {data.get('format')!r}")
        return cls(table=data["table"], snapshot=data["snapshot"], training=bool(data["training"]),
                   borrowing=bool(data["borrowing"]), last_step=dict(data["last_step"]),
                   workers=dict(data["workers"]), intent=data.get("intent"))


class StateFile:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "state.json"

    def save(self, record: ControlRecord) -> None:
        tmp = self.path.with_suffix(".tmp")
        data = json.dumps(record.to_dict(), indent=1).encode()
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self) -> ControlRecord | None:
        if not self.path.exists():
            return None
        return ControlRecord.from_dict(json.loads(self.path.read_text()))
