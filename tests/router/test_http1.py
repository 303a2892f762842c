"""The lane's HTTP/1.1 heads (``router.http1``): a head built from any header names and
values aiohttp accepts parses back to them; a head with a control character, a bare LF or
a repeated singleton header is left to aiohttp."""
from __future__ import annotations

from hypothesis import given, strategies as st

from pearl_sglang.router.http1 import AnswerHeads, bare_lf, parse_head, plain_json_length

TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
names = st.text(TOKEN_CHARS, min_size=1, max_size=20).filter(lambda n: n.lower() not in (
    "content-length", "host", "connection", "content-type", "transfer-encoding"))
values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=40)


def _head(pairs: list[tuple[str, str]]) -> bytes:
    return b"POST /generate HTTP/1.1\r\n" + b"\r\n".join(f"{n}: {v}".encode() for n, v in pairs)


@given(st.lists(st.tuples(names, values), max_size=10))
def test_a_head_parses_back_to_its_headers(pairs):
    head = parse_head(_head([("Host", "h"), *pairs]))
    assert head is not None and head.method == b"POST" and head.target == b"/generate"
    assert list(head.headers.items()) == [("Host", "h"), *pairs]


@given(st.lists(st.tuples(names, values), max_size=5), st.sampled_from("\x00\x01\x0b\x1f\x7f\r\n"))
def test_a_control_character_in_a_value_leaves_the_head_to_aiohttp(pairs, control):
    raw = _head([*pairs, ("X-Bad", f"a{control}b")])
    assert parse_head(raw) is None


@given(st.integers(1, 10_000), st.integers(1, 10_000))
def test_the_body_length_is_taken_only_within_the_limit_and_once(length, limit):
    head = parse_head(_head([("Host", "h"), ("Content-Length", str(length))]))
    assert plain_json_length(head.headers, limit) == (length if length <= limit else None)
    twice = parse_head(_head([("Host", "h"), ("Content-Length", str(length)), ("Content-Length", str(length))]))
    assert plain_json_length(twice.headers, limit) is None
    no_host = parse_head(_head([("Content-Length", str(length))]))
    assert plain_json_length(no_host.headers, limit) is None


def test_a_bare_lf_anywhere_in_the_head_is_seen():
    assert bare_lf(b"GET / HTTP/1.1\nHost: x")
    assert bare_lf(b"GET / HTTP/1.1\r\nHost: x\n")
    assert not bare_lf(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert not bare_lf(b"GET / HTTP/1.1\r")  # a CR whose LF has not arrived yet


def test_answer_heads_are_aiohttps():
    heads = AnswerHeads()
    head = heads(499, b"Content-Length: 0\r\n", close=True, now=0.0)
    assert head.startswith(b"HTTP/1.1 499 \r\nContent-Length: 0\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n")
    assert head.endswith(b"Connection: close\r\n\r\n")
    assert heads(200, b"", close=False, now=0.0).startswith(b"HTTP/1.1 200 OK\r\n")
