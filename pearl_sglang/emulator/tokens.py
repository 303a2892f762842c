"""Deterministic "model": the next token as a pure function of weights and context.

The emulated model has no parameters.  Its output token after a context ``c`` under
weight version ``v`` is ``f(v, c)``: a 64-bit polynomial rolling hash of ``c`` (kept
incrementally, O(1) per generated token) mixed with a salt derived from ``v`` (and the
request's ``sampling_seed`` if any).  So a request aborted on one worker and resubmitted
elsewhere as prompt + partial output continues token for token, as long as the weights
are the same; different weight versions give different continuations.

Invariants (tested): the hash of a sequence computed in bulk equals the hash built one
token at a time; ``next_token`` never returns a special token or EOS; EOS is drawn with
the profile's probability from an independent bit of the same hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .prompt_ids import PromptIds

if TYPE_CHECKING:
    from .request import SamplingParams

MASK = (1 << 64) - 1
BASE = 0x100000001B3  # FNV prime: odd, so multiplication is a bijection mod 2**64
_NP_BASE = np.uint64(BASE)

# Salt used after /resume_memory_occupation restored weights without a CPU backup:
# the memory holds garbage until the next weight update, so the tokens differ.
GARBAGE_WEIGHTS = "\x00uninitialized-weights"


# splitmix64's constants, and the salts of the EOS coin and of an early stop id's redraw
# (``stretch_draws`` compiles the same arithmetic).
SPLITMIX_ADD, SPLITMIX_M1, SPLITMIX_M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
EOS_SALT, STOP_SALT = 0x5EED_E05E_0F5E_0000, 0xA5A5A5A5


def splitmix64(x: int) -> int:
    x = (x + SPLITMIX_ADD) & MASK
    x = ((x ^ (x >> 30)) * SPLITMIX_M1) & MASK
    x = ((x ^ (x >> 27)) * SPLITMIX_M2) & MASK
    return x ^ (x >> 31)


def extend_hash(h: int, token: int) -> int:
    return (h * BASE + token + 1) & MASK


class _Powers:
    """BASE**k mod 2**64 for k < n, grown on demand (one per process is enough)."""

    def __init__(self) -> None:
        self._pw = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> np.ndarray:
        if len(self._pw) < n:
            size = max(n, 2 * len(self._pw))
            pw = np.empty(size, dtype=np.uint64)
            pw[0] = 1
            with np.errstate(over="ignore"):
                for i in range(1, size):  # only when growing; amortised O(1)
                    pw[i] = pw[i - 1] * _NP_BASE
            self._pw = pw
        return self._pw[:n]


_POWERS = _Powers()


def hash_tokens(tokens: "list[int] | np.ndarray", h: int = 0) -> int:
    """Hash ``tokens`` appended to a context whose hash is ``h`` (bulk, numpy)."""
    n = len(tokens)
    if n == 0:
        return h
    if n < 32:
        for t in tokens:
            h = (h * BASE + int(t) + 1) & MASK
        return h
    arr = np.asarray(tokens, dtype=np.uint64) + np.uint64(1)
    pw = _POWERS.get(n + 1)
    with np.errstate(over="ignore"):
        body = int(np.dot(arr, pw[n - 1::-1])) & MASK
    return (h * int(pw[n]) + body) & MASK


class _ChainPowers:
    """S**k and S**-k mod 2**64 for S = BASE**page, to chain page hashes with numpy."""

    def __init__(self) -> None:
        self._by_page: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def get(self, page: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        fwd, inv = self._by_page.get(page, (np.ones(0, np.uint64), np.ones(0, np.uint64)))
        if len(fwd) < n:
            size = max(n, 2 * len(fwd), 64)
            step = pow(BASE, page, 1 << 64)
            istep = pow(step, -1, 1 << 64)
            f, i, a, b = [], [], 1, 1
            for _ in range(size):
                f.append(a)
                i.append(b)
                a, b = a * step & MASK, b * istep & MASK
            fwd, inv = np.array(f, dtype=np.uint64), np.array(i, dtype=np.uint64)
            self._by_page[page] = (fwd, inv)
        return fwd[:n], inv[:n]


_CHAIN = _ChainPowers()


def _as_uint64(tokens: "list[int] | tuple[int, ...] | PromptIds | np.ndarray", n: int) -> np.ndarray:
    """The first ``n`` ids as uint64.  Python ints convert to int64 about twice as fast as
    to uint64 (a prompt is converted on every request); ids that int64 cannot hold, or
    negative ones, take the direct conversion, which keeps its errors and values."""
    if isinstance(tokens, PromptIds):
        return tokens.array[:n]
    if not isinstance(tokens, np.ndarray):
        try:
            arr = np.fromiter(tokens, dtype=np.int64, count=n)
        except OverflowError:
            pass
        else:
            if arr.min() >= 0:
                return arr.view(np.uint64)
    return np.asarray(tokens[:n], dtype=np.uint64)


def block_hashes(tokens: "list[int] | tuple[int, ...] | PromptIds | np.ndarray", page: int,
                 h: int = 0) -> list[int]:
    """Hashes of every full ``page``-token prefix of ``tokens`` (prefix-cache keys),
    continuing a context whose hash is ``h``.

    Key b is ``hash_tokens(tokens[:(b+1)*page], h)``: per-page hashes are chained as
    ``H_b = h S**(b+1) + sum_j h_j S**(b-j) = S**b * (h S + cumsum(h_j S**-j))`` in
    wrapping uint64.
    """
    nblocks = len(tokens) // page
    if nblocks == 0:
        return []
    arr = _as_uint64(tokens, nblocks * page).reshape(nblocks, page)
    pw = _POWERS.get(page + 1)
    fwd, inv = _CHAIN.get(page, nblocks + 1)
    with np.errstate(over="ignore"):
        per_block = (arr + np.uint64(1)) @ pw[page - 1::-1]
        if h:
            per_block[0] += np.uint64(h) * fwd[1]
        keys = fwd[:nblocks] * np.cumsum(per_block * inv[:nblocks], dtype=np.uint64)
    return keys.tolist()


_LOOP_TOKENS = 384


def extend_block_hashes(keys: list[int], page: int, tail: "list[int]") -> list[int]:
    """``keys`` of a sequence continued by ``tail`` (tokens after its last full page): a
    Python loop for a short tail, numpy beyond _LOOP_TOKENS (about where they cost the same)."""
    h = keys[-1] if keys else 0
    if len(tail) >= _LOOP_TOKENS:
        return [*keys, *block_hashes(tail, page, h)]
    out = list(keys)
    for i in range(len(tail) // page):
        for t in tail[i * page:(i + 1) * page]:
            h = (h * BASE + t + 1) & MASK
        out.append(h)
    return out


def prompt_hashes(tokens: "list[int] | tuple[int, ...] | PromptIds", page: int) -> tuple[list[int], int]:
    """(page keys, hash of the whole sequence), converting ``tokens`` only once."""
    keys = block_hashes(tokens, page)
    return keys, hash_tokens(tokens[len(keys) * page:], keys[-1] if keys else 0)


def version_salt(version: str, sampling_seed: "int | None" = None) -> int:
    key = version if sampling_seed is None else f"{version}\x00seed={sampling_seed}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class TokenSpace:
    """Which ids the emulated model may emit: [0, vocab) minus specials and EOS."""

    vocab_size: int
    eos_token_id: int
    special_ids: frozenset[int] = frozenset()
    eos_probability: float = 0.0
    low: int = 0

    def next_token(self, h: int, salt: int) -> int:
        x = splitmix64(h ^ salt)
        span = self.vocab_size - self.low
        tok = self.low + x % span
        while tok == self.eos_token_id or tok in self.special_ids:
            x = splitmix64(x)
            tok = self.low + x % span
        return tok

    def wants_eos(self, h: int, salt: int) -> bool:
        if self.eos_probability <= 0.0:
            return False
        x = splitmix64(h ^ salt ^ EOS_SALT)
        return (x >> 11) * (1.0 / (1 << 53)) < self.eos_probability

    def logprob(self, h: int, salt: int) -> float:
        """A deterministic stand-in log-probability in (-4, 0]."""
        return -((splitmix64(h ^ salt ^ 0x10) >> 11) * (1.0 / (1 << 53))) * 4.0


def fake_first_token(rid: str, vocab_size: int) -> int:
    """SGLang's fake transfer backend: ``blake2b(rid) % vocab``."""
    d = hashlib.blake2b(rid.encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") % vocab_size


def draw(space: TokenSpace, sp: "SamplingParams", h: int, salt: int, n_out: int) -> int:
    """The token a request emits after ``n_out`` output tokens with context hash ``h``."""
    if not sp.ignore_eos and n_out >= sp.min_new_tokens and space.wants_eos(h, salt):
        return space.eos_token_id
    tok = space.next_token(h, salt)
    if n_out < sp.min_new_tokens and tok in sp.stop_token_ids:
        tok = space.next_token(h ^ STOP_SALT, salt)
    return tok
