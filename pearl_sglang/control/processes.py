"""Start and stop SGLang-protocol servers (real SGLang or the emulator) as processes.

Used by the local launcher, the demo, the tests and the benchmarks. Each server runs in
its own process group with a parent-death signal, so a crashed or interrupted run does not
leave servers behind, and ``stop`` ends the whole group (SGLang's scheduler and
detokenizer included) by PID.
"""
from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy; the message carries its log's tail."""


# Listening ports come from below Linux's ephemeral range (32768-60999 by default), so an
# outgoing connection cannot take a port between the choice and the server's bind, and
# outside the ranges other software on the host picks ports from the same way: SGLang
# binds its NCCL/TCPStore port later, in a child, from 22000-29999
# (``get_free_port_below_ephemeral``), and Ray's workers use 10002-19999. A port chosen
# there could be taken by a worker's own child a moment after it was found free.
_AVOIDED = (range(10000, 20000), range(22000, 30000))
_AVOIDED_PORTS = frozenset(p for r in _AVOIDED for p in r)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def listen_ports() -> list[int]:
    """The ports PEARL hands to the servers it starts."""
    top = max(_ephemeral_low(), 30100)
    return [p for p in range(20000, top) if p not in _AVOIDED_PORTS]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, chosen at random from ``listen_ports``. A host that
    does not resolve, or is not an address of this machine, fails at once (each bind would
    resolve it again: thousands of lookups blocking the event loop)."""
    try:
        address = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError) as e:
        raise OSError(f"cannot resolve host {host!r}: {e}") from None
    rng = random.SystemRandom()
    ports = listen_ports()
    for _ in range(200):
        port = rng.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    raise OSError(f"host {host!r} is not an address of this machine") from None
                continue
            return port
    raise OSError(f"no free port in 20000-21999 or 30000-{ports[-1]} on {host}")


class PortPool:
    """Ports handed out by one launcher and still in use: two workers started at the same
    moment never get the same port (a bind test alone cannot tell them apart)."""

    def __init__(self) -> None:
        self._taken: set[int] = set()

    def take(self, host: str = "127.0.0.1") -> int:
        for _ in range(200):
            port = free_port(host)
            if port not in self._taken:
                self._taken.add(port)
                return port
        raise OSError("no free port left that this launcher has not handed out")

    def release(self, *ports: int | None) -> None:
        for port in ports:
            self._taken.discard(port)


def _die_with_parent() -> None:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def kill_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal the process group led by ``pid``; False if it is gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL for a worker that serves


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: Sequence[str]
    port: int
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    health_path: str = "/health"
    # False for workers that must outlive a crashed control plane (it re-adopts them).
    die_with_parent: bool = True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class ServerProcess:
    """One server process; start from the main thread (the death signal follows the thread)."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> "ServerProcess":
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.spec.log_path, "ab")
        env = {**os.environ, **self.spec.env}
        self._proc = subprocess.Popen(
            list(self.spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, preexec_fn=_die_with_parent if self.spec.die_with_parent else os.setsid)
        log.close()
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.spec.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.spec.health_path, timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, as tests simulate it)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(10)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The group may still hold children that outlived the leader.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
