"""A raw-socket HTTP peer for adapter tests: answers every connection with fixed bytes,
as they are (a malformed status line, a redirect, a body cut short or trickled), and
records what each request sent."""
from __future__ import annotations

import socket
import threading
import time


class RawAnswer:
    """Answers each connection with ``head`` and ``body``: ``body`` one byte every
    ``trickle_s`` if set, then holds the connection open for ``hold_s`` (a body that
    stalls) or closes it (cut short). ``received``: each request's bytes."""

    def __init__(self, head: bytes, body: bytes = b"", hold_s: float = 0.0, trickle_s: float = 0.0) -> None:
        self.head, self.body, self.hold_s, self.trickle_s = head, body, hold_s, trickle_s
        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.received.append(conn.recv(65536))
                conn.sendall(self.head)
                if self.trickle_s:
                    for i in range(len(self.body)):
                        conn.sendall(self.body[i:i + 1])
                        time.sleep(self.trickle_s)
                else:
                    conn.sendall(self.body)
                time.sleep(self.hold_s)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawAnswer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
