"""A prompt's token ids kept as the JSON text they arrived in, decoded only when read.

A rollout turn carries its whole context (thousands to tens of thousands of ids), and
the router needs the ids themselves only to resubmit a moved request or to key the few
ids after the prompt's last full block. Placement needs the prompt's length and its
block keys: one compiled pass (``parse_ids``) validates compact text and reads the ids
into a uint64 array on the way, from which ``block_keys`` makes the keys (text with
whitespace is compacted first and keyed from its digits; no Python loop per token
either way), and the worker gets the same text back inside the body (``fastjson`` writes
it as a raw JSON fragment). Decoding 4K ids into Python ints and encoding them again was
the largest share of a request's cost.
A caller in the router's process that holds the ids as an array (the replay harness)
hands over the array instead; text is written from it only if something reads it.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence, overload

import numpy as np
import orjson
from numba import njit

_COMMA = ord(",")
_ZERO, _NINE = ord("0"), ord("9")
# The longest id the text path takes (every integer this long fits in 64 bits); a body
# with a longer one (never a real token id) takes the generic JSON path.
MAX_DIGITS = 19


def comma_positions(text: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == _COMMA)


@njit(cache=True, inline="always")
def _bad_element(digits: np.ndarray, start: int, end: int) -> bool:
    """What a JSON decoder refuses (an empty element, a leading zero) or the text path
    does not take (more than MAX_DIGITS digits), of the element at ``digits[start:end]``."""
    length = end - start
    return length == 0 or length > MAX_DIGITS or (length > 1 and digits[start] == _ZERO)


@njit(cache=True)
def _canonical(text: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    n = len(text)
    out = np.empty(n, dtype=np.uint8)
    commas = np.empty(n // 2 + 1, dtype=np.intp)
    k = m = start = 0  # bytes written, commas found, where the current element began
    gap = False  # whitespace since the current element's last digit
    for i in range(n + 1):
        c = text[i] if i < n else _COMMA
        if _ZERO <= c <= _NINE:
            if gap and k > start:
                return out[:0], commas[:0], False  # "1 2": two numbers without a comma
            gap = False
            out[k] = c
            k += 1
        elif c == _COMMA:
            if _bad_element(out, start, k):
                return out[:0], commas[:0], False
            if i < n:
                out[k] = c
                commas[m] = k
                k += 1
                m += 1
            start = k
            gap = False
        elif c == 32 or c == 9 or c == 10 or c == 13:  # JSON's whitespace
            gap = True
        else:
            return out[:0], commas[:0], False
    return out[:k], commas[:m], True


@njit(cache=True)
def _compact_values(text: np.ndarray) -> tuple[np.ndarray, bool]:
    """The ids of compact text (digits and commas only), read on the way; False for
    anything else, whitespace included (``_canonical`` then decides)."""
    n = len(text)
    values = np.empty(n // 2 + 1, dtype=np.uint64)
    m = start = 0
    v = np.uint64(0)
    for i in range(n + 1):
        c = text[i] if i < n else _COMMA
        if c == _COMMA:
            if _bad_element(text, start, i):
                return values[:0], False
            values[m] = v
            m += 1
            v = np.uint64(0)
            start = i + 1
        elif _ZERO <= c <= _NINE:
            v = v * np.uint64(10) + np.uint64(c - _ZERO)
        else:
            return values[:0], False
    return values[:m].copy(), True


def parse_ids(text: bytes) -> "EncodedIds | None":
    """The ids inside a JSON list's brackets, under ``canonical_ids``'s rules, or None.
    Compact text (a client's own separators, and every list PEARL writes) takes one
    compiled pass that also reads the values, so the prompt's block keys, its length and
    any decoding come from that array (``block_keys.of_ids``) and nothing reads the text
    again; text with whitespace is compacted first (``canonical_ids``). At 32,768 ids the
    single pass and the keys from its array took ~0.5 ms against ~0.8 for compacting and
    keying the text (one run of each, this machine)."""
    values, ok = _compact_values(np.frombuffer(text, dtype=np.uint8))
    if ok:
        return EncodedIds(text, array=values)
    canonical = canonical_ids(text)
    return None if canonical is None else EncodedIds(*canonical)


def canonical_ids(text: bytes) -> tuple[bytes, np.ndarray] | None:
    """``text`` without its whitespace and the positions of its commas, when it is a
    non-empty list of JSON integers of at most MAX_DIGITS digits, else None: only digits,
    commas and whitespace between them, no empty element (``1,,2``, a leading or trailing
    comma) and no leading zero (``01``), as a JSON decoder would require. One compiled
    pass: with numpy's checks over the comma positions (a fixed cost per call) and a
    ``translate`` for the whitespace, a body of 24 ids took 56 us to parse and one of
    32,768 took 813 us; with this pass, 12 and 411 (JSON's default separators)."""
    compact, commas, ok = _canonical(np.frombuffer(text, dtype=np.uint8))
    if not ok:
        return None
    return (text if len(compact) == len(text) else compact.tobytes()), commas


def warm() -> None:
    """Load (or compile, once per machine) the kernel, as a server starts."""
    canonical_ids(b"0")
    parse_ids(b"0")


class EncodedIds(Sequence[int]):
    """Non-negative token ids as canonical JSON text without brackets (``b"1,2,3"``),
    already validated (``canonical_ids``), or as the array a caller in this process
    holds (``of_array``: the text is written only if something reads it). Compares equal
    to any sequence of the same ids; slicing from a block boundary decodes only the tail."""

    __slots__ = ("_text", "_commas", "_ids", "array")

    def __init__(self, text: bytes, commas: np.ndarray | None = None, *, array: np.ndarray | None = None) -> None:
        """``array``: the same ids as uint64, when already read (``parse_ids``)."""
        self._text: bytes | None = text
        self._commas = comma_positions(text) if commas is None and array is None else commas
        self._ids: list[int] | None = None
        self.array: np.ndarray | None = array  # uint64, when made from one or read with the text

    @classmethod
    def of_array(cls, ids: np.ndarray) -> "EncodedIds":
        """The ids of a non-empty 1-d integer array whose values are all ids the text
        takes (0 to 10^MAX_DIGITS - 1); ``ValueError`` for any other."""
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or not len(ids):
            raise ValueError(f"need a non-empty 1-d integer array, not {ids.dtype} {ids.shape}")
        if ids.min() < 0 or int(ids.max()) >= 10 ** MAX_DIGITS:
            raise ValueError("ids must lie in [0, 10^19)")
        encoded = cls.__new__(cls)
        encoded._text, encoded._commas, encoded._ids = None, None, None
        encoded.array = np.ascontiguousarray(ids, dtype=np.uint64)
        return encoded

    @property
    def text(self) -> bytes:
        if self._text is None:
            self._text = orjson.dumps(self.array, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        return self._text

    @property
    def commas(self) -> np.ndarray:
        if self._commas is None:
            self._commas = comma_positions(self.text)
        return self._commas

    def __len__(self) -> int:
        return len(self.array) if self.array is not None else len(self._commas) + 1

    def decoded(self) -> list[int]:
        if self._ids is None:
            self._ids = self.array.tolist() if self.array is not None else orjson.loads(b"[" + self.text + b"]")
        return self._ids

    def as_uint64(self) -> np.ndarray:
        """The ids as a new uint64 array, parsed from the text in C (every canonical id of
        at most MAX_DIGITS digits fits), or copied from the array they came as."""
        if self.array is not None:
            return self.array.copy()
        return np.fromstring(self.text, dtype=np.uint64, sep=",")

    @property
    def is_decoded(self) -> bool:
        return self._ids is not None

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice) and self._ids is None and index.step is None and index.stop is None:
            start = index.start or 0
            if self.array is not None:
                return self.array[start:].tolist()
            if 0 < start < len(self):
                return orjson.loads(b"[" + self.text[int(self.commas[start - 1]) + 1:] + b"]")
            if start == 0 or start >= len(self):
                return orjson.loads(b"[" + self.text + b"]") if start == 0 else []
        return self.decoded()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EncodedIds):
            return self.text == other.text
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and list(other) == self.decoded()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"EncodedIds({len(self)} ids)"

    def json_fragment(self) -> orjson.Fragment:
        return orjson.Fragment(b"[" + self.text + b"]")


def as_list(ids: Sequence[int]) -> list[int]:
    """A plain list (for code that must hold or change the ids)."""
    return ids.decoded() if isinstance(ids, EncodedIds) else list(ids)
