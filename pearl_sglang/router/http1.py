"""HTTP/1.1 on the wire, as the ``/generate`` lane speaks it (``generate_lane``).

The lane answers only requests whose head is plainly what it looks like; anything
aiohttp's strict parser would refuse or treat specially (another version, a bare LF, a
control character in a value, a repeated singleton header, no ``Host``, more than 128
headers, a body framed other than by one ``Content-Length``) is left to aiohttp, which
answers it as it always has. No I/O here: the lane's connections use these functions.
"""
from __future__ import annotations

import re
from email.utils import formatdate
from typing import NamedTuple

from aiohttp.http import SERVER_SOFTWARE
from aiohttp.web_response import REASON_PHRASES
from multidict import CIMultiDict

MAX_HEAD = 8190  # longer heads go to aiohttp (its own line limit answers them)
MAX_HEADERS = 128  # aiohttp's max_headers
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # a bare CR or LF, NUL, ...: aiohttp refuses them
# Body framing or meaning the lane does not handle.
_NOT_PLAIN = ("Transfer-Encoding", "Content-Encoding", "Expect", "Upgrade", "Sec-WebSocket-Key1")
# aiohttp's request parser refuses a second one of these (400).
_SINGLETONS = ("Content-Length", "Content-Location", "Content-Range", "Content-Type", "ETag", "Host",
               "Max-Forwards", "Server", "Transfer-Encoding", "User-Agent", "Connection")
_SERVER = SERVER_SOFTWARE.encode()


class Head(NamedTuple):
    method: bytes
    target: bytes
    headers: CIMultiDict[str]


def bare_lf(head: bytes | bytearray) -> bool:
    """A line of the head (whole or in part) ends in LF without CR: aiohttp answers it 400."""
    return head.count(b"\n") != head.count(b"\r\n")


def parse_head(head: bytes) -> Head | None:
    """An HTTP/1.1 request head (without its blank line), or None when it is anything left
    to aiohttp: another version, an odd request line, a header that is not ``token: value``
    or whose value holds a control character."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            return None
        headers.add(name.decode("ascii"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
    return Head(parts[0], parts[1], headers)


def plain_json_length(headers: CIMultiDict[str], max_body_bytes: int) -> int | None:
    """The body length of a request with a plain JSON body (one ``Content-Length``, 1 to
    ``max_body_bytes`` bytes, no other framing or encoding, a JSON content type or none,
    ``Host`` given once, keep-alive or close), else None."""
    if any(name in headers for name in _NOT_PLAIN) or "Host" not in headers or len(headers) > MAX_HEADERS:
        return None
    if any(len(headers.getall(name, ())) > 1 for name in _SINGLETONS):
        return None
    length = headers.get("Content-Length", "")
    if not (length.isascii() and length.isdigit()) or not 0 < int(length) <= max_body_bytes:
        return None
    if "json" not in headers.get("Content-Type", "application/json"):
        return None
    if headers.get("Connection", "keep-alive").lower() not in ("keep-alive", "close"):
        return None
    return int(length)


def wants_close(headers: CIMultiDict[str]) -> bool:
    return headers.get("Connection", "").lower() == "close"


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


class AnswerHeads:
    """Answer heads as aiohttp writes them (its reason phrases, ``Date``, ``Server``); the
    ``Date`` is formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._date = b""

    def __call__(self, status: int, fields: bytes, *, close: bool, now: float) -> bytes:
        """``fields``: the answer's own header lines, each ending in CRLF; ``now``: epoch seconds."""
        second = int(now)
        if second != self._second:
            self._second, self._date = second, formatdate(now, usegmt=True).encode()
        return b"HTTP/1.1 %d %s\r\n%sDate: %s\r\nServer: %s\r\n%s\r\n" % (
            status, REASON_PHRASES.get(status, "").encode(), fields, self._date, _SERVER,
            b"Connection: close\r\n" if close else b"")
