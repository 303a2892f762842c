"""Why a worker process failed to start, read from its own output.

SGLang does not always exit when it cannot serve: a worker whose HTTP port was taken logs
``address already in use`` and keeps its scheduler alive, so waiting for ``/health``
alone would take the whole ``start_timeout_s``. The launcher reads the worker's log while
it waits and stops at the first line that means the start has failed. A taken port is
retryable (start again on another port); a broken engine setting is not, and its message
says which key to change. Purely computational: text in, a typed error or None out.
"""
from __future__ import annotations

import re


class LaunchError(RuntimeError):
    """A worker did not start or did not become healthy in time."""


class PortInUse(LaunchError):
    """The worker's port was taken before it could bind it; another port may work."""


class EngineCannotStart(LaunchError):
    """The engine cannot run with this configuration; retrying will not help."""


_PORT_TAKEN = re.compile(r"address already in use|errno 98\b|port is already in use", re.IGNORECASE)
_NO_CUDA = re.compile(r"libcuda\.so[.\d]*: cannot open|libcuda\.so\.1", re.IGNORECASE)


def start_failure(output: str, *, memory_saver: bool) -> LaunchError | None:
    """The failure ``output`` (the worker's log since its start) shows, if any."""
    if _PORT_TAKEN.search(output):
        return PortInUse(f"the worker could not bind its port (taken by another process):\n{_tail(output)}")
    if _NO_CUDA.search(output):
        hint = ("engine.memory_saver: true needs CUDA (torch_memory_saver loads libcuda.so.1); on a CPU "
                "build set engine.memory_saver: false and leave zones.overlap empty (borrowing needs the "
                "memory saver)" if memory_saver else
                "this engine needs CUDA (libcuda.so.1), which this host does not have")
        return EngineCannotStart(f"{hint}:\n{_tail(output)}")
    return None


def _tail(output: str, lines: int = 20) -> str:
    return "\n".join(output.splitlines()[-lines:])
