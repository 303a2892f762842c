"""The control plane's crash-safe record: written atomically before and after every act.

One JSON document (``state.json`` in ``--state-dir``) holds the table, the latest weight
snapshot and the numbered log of adopted pushes (the staleness bound counts from it), the
training/borrowing flags, where each launched worker lives (endpoint, PID) and the
*intent*: the plan being executed, written before any worker is touched and cleared when
it is done. A router killed at any moment finds on restart what it was
doing and what it had launched; ``reconcile`` then checks that against the workers
themselves instead of trusting the record. The write is a temp file, ``fsync``, atomic
``rename`` and a directory ``fsync``: a crash leaves the old document or the new one,
never a torn one.

A state directory belongs to one router at a time: ``StateFile`` holds an exclusive
``flock`` on ``DIR/lock`` for as long as it is open (the kernel drops it when the process
dies, so a crashed router never blocks its restart). A second router on the same
directory would adopt, stop and delete the first one's workers and record; it is refused.
"""
from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl_sglang.core.errors import CoreError
from pearl_sglang.core.pd_mode import PdMode
from pearl_sglang.core.state import StateTable
from pearl_sglang.core.weight_snapshot import WeightSnapshot

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
    pushes: dict[str, Any] | None = None  # the adopted-push log (``PushLog.to_dict``)
    pd_mode: str | None = None  # the PD mode in force (an operator's /pearl/pd_mode outlives a restart)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "table": self.table, "snapshot": self.snapshot, "training": self.training,
                "borrowing": self.borrowing, "last_step": self.last_step, "workers": self.workers,
                "intent": self.intent, "pushes": self.pushes, "pd_mode": self.pd_mode}

    @classmethod
    def from_dict(cls, data: Any) -> "ControlRecord":
        if not isinstance(data, dict):
            raise UnreadableRecord(f"the record is a {type(data).__name__}, not an object")
        if data.get("format") != FORMAT:
            raise UnreadableRecord(f"unknown control record format {data.get('format')!r}")
        shapes = {"table": dict, "snapshot": dict, "last_step": dict, "workers": dict, "training": bool,
                  "borrowing": bool}
        wrong = sorted(k for k, kind in shapes.items() if not isinstance(data.get(k), kind))
        if wrong:
            raise UnreadableRecord(f"missing or malformed field(s): {', '.join(wrong)}")
        try:  # what the restart path reads back from them
            StateTable.from_dict(data["table"])
            WeightSnapshot.from_dict(data["snapshot"])
            if data.get("pd_mode") is not None:
                PdMode(data["pd_mode"])
        except (CoreError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UnreadableRecord(f"malformed table or snapshot: {e!r}") from e
        return cls(table=data["table"], snapshot=data["snapshot"], training=data["training"],
                   borrowing=data["borrowing"], last_step=dict(data["last_step"]),
                   workers=dict(data["workers"]), intent=data.get("intent"), pushes=data.get("pushes"),
                   pd_mode=data.get("pd_mode"))


class UnreadableRecord(ValueError):
    """The state directory's record cannot be read back: the router refuses to start
    rather than start from nothing (it would forget the worker processes it recorded)."""


class StateDirInUse(RuntimeError):
    """Another live process holds the state directory's lock."""


class StateFile:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "state.json"
        self._lock_fd: int | None = _lock(self.dir / "lock")

    def close(self) -> None:
        """Give up the directory (an orderly stop); the record stays as it is."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

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
        try:
            return ControlRecord.from_dict(json.loads(self.path.read_bytes()))
        except (ValueError, RecursionError) as e:  # UnreadableRecord, JSON and UTF-8 errors
            raise UnreadableRecord(f"state dir {self.dir}: {self.path.name} cannot be read back ({e}); "
                                   "move it away to start without it") from e


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirInUse(f"state dir {path.parent} is in use by another router (pid {holder}); "
                            "stop it first, or give this router its own --state-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
