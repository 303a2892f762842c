"""Chained 64-bit keys of a prompt's full blocks of ids, computed compiled.

The router learns which worker holds which prefix from block keys (``selection``): key
k stands for the prompt's first (k + 1) * ``block`` ids, so prompts with equal prefixes
share their leading keys. A block mixes its ids' values one by one (a multiply each),
and its key is the block's mix (splitmix64) mixed into the key before it. One compiled
pass makes them, from either form a prompt comes in: the canonical JSON text of a
request's ids (``b"1,2,3"``, digits read on the way: no list of ints, no slices), or an
array the caller already holds (the replay's in-process front door, a prompt plus its
output). Both give the same keys.

Keys are compared for equality within one process only: a per-process seed, as Python's
own string hash has, keeps a client from crafting prompts whose keys collide.
"""
from __future__ import annotations

import os

import numpy as np
from numba import njit

_U = np.uint64
_ADD, _M1, _M2 = _U(0x9E3779B97F4A7C15), _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)
_S30, _S27, _S31 = _U(30), _U(27), _U(31)
_TEN, _ZERO_DIGIT = _U(10), _U(ord("0"))
SEED = int.from_bytes(os.urandom(8), "little")
_MASK = (1 << 64) - 1


@njit(cache=True, inline="always")
def _mix(x: np.uint64) -> np.uint64:
    x = x + _ADD
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


# _PLACE[n, j]: the place value of digit j of an n-digit id (0 past its last digit).
_PLACE = np.array([[10 ** (n - 1 - j) if j < n else 0 for j in range(6)] for n in range(7)], dtype=np.uint64)


@njit(cache=True, inline="always")
def _step(b: np.uint64, v: np.uint64) -> np.uint64:
    return (b ^ v) * _M1


@njit(cache=True)
def _text_keys(text: np.ndarray, commas: np.ndarray, start: np.ndarray, block: int, place: np.ndarray) -> np.ndarray:
    """An id of up to 6 digits (every vocabulary's) is read as 6 bytes times their place
    values, no branch per digit; longer ones digit by digit."""
    h, seed, size = start[0], start[1], len(text)
    out = np.empty((len(commas) + 1) // block, dtype=np.uint64)
    s = 0
    for k in range(len(out)):
        b = seed
        for i in range(k * block, (k + 1) * block):
            e = commas[i] if i < len(commas) else size
            n = e - s
            if n <= 6 and s + 6 <= size:
                v = ((_U(text[s]) - _ZERO_DIGIT) * place[n, 0] + (_U(text[s + 1]) - _ZERO_DIGIT) * place[n, 1]
                     + (_U(text[s + 2]) - _ZERO_DIGIT) * place[n, 2] + (_U(text[s + 3]) - _ZERO_DIGIT) * place[n, 3]
                     + (_U(text[s + 4]) - _ZERO_DIGIT) * place[n, 4] + (_U(text[s + 5]) - _ZERO_DIGIT) * place[n, 5])
            else:
                v = _U(0)
                for j in range(s, e):
                    v = v * _TEN + (_U(text[j]) - _ZERO_DIGIT)
            b = _step(b, v)
            s = e + 1
        h = _mix(h ^ _mix(b))
        out[k] = h
    return out


@njit(cache=True)
def _id_keys(ids: np.ndarray, start: np.ndarray, block: int) -> np.ndarray:
    h, seed = start[0], start[1]
    out = np.empty(len(ids) // block, dtype=np.uint64)
    for k in range(len(out)):
        b = seed
        for i in range(k * block, (k + 1) * block):
            b = _step(b, ids[i])
        h = _mix(h ^ _mix(b))
        out[k] = h
    return out


def _start(h: int) -> np.ndarray:
    """The key to continue from and the seed, as one array: numba takes an array argument
    on its fast path, a numpy scalar through Python (~15 us a call). ``h`` may be any int
    (a text prompt's keys are Python's signed hashes): its low 64 bits continue the chain."""
    return np.array((h & _MASK, SEED), dtype=np.uint64)


def of_text(text: bytes, commas: np.ndarray, block: int, h: int = 0) -> tuple[int, ...]:
    """Keys of the full blocks of canonical id text (non-negative JSON integers of at most
    19 digits, as ``encoded_ids.canonical_ids`` accepts) whose commas are at ``commas``,
    continuing from key ``h`` (0: from the start)."""
    return tuple(_text_keys(np.frombuffer(text, dtype=np.uint8), commas, _start(h), block, _PLACE).tolist())


def of_ids(ids: np.ndarray, block: int, h: int = 0) -> tuple[int, ...]:
    """Keys of the full blocks of a uint64 id array, continuing from key ``h``."""
    return tuple(_id_keys(ids, _start(h), block).tolist())


def warm() -> None:
    """Load (or compile, once per machine) both kernels, as a server starts: a first call
    takes about 0.3 s, which its first request would otherwise wait."""
    of_text(b"0", np.zeros(0, dtype=np.intp), 1)
    of_ids(np.zeros(1, dtype=np.uint64), 1)
