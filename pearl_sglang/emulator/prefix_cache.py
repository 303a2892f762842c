"""Per-worker prefix cache: page-granular, reference-counted, LRU eviction.

Stands in for SGLang's radix cache.  Keys are hashes of whole page-aligned prefixes
(``tokens.block_hashes``), so a key identifies a page together with everything before
it, exactly like a radix-tree path.  Pages used by a running request are locked; only
unlocked pages are evictable, least recently used first.  Because a match touches a
prefix from its end to its start, a parent page is always more recent than its
children, so eviction removes leaves before the pages they hang from.

A request's pages come and go a few hundred at a time, so the pages are entries of
fixed arrays worked on compiled: a hash index (linear probing, deletion by backward
shift), each page's reference count (-1: a free entry), and a recency list of the
unlocked pages threaded through the entries (entry 0 is its sentinel). Keys are any
ints; their low 64 bits are what is stored. The arrays grow as pages arrive. (The
router's prefix map has the same index; see ``router/prefix_map.py`` for why each keeps
its own.)

Invariants (tested): ``tokens == pages * page``; ``evictable_tokens <= tokens``;
eviction never removes a locked page; a key's refcount never goes negative.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

_MASK = (1 << 64) - 1
_FIB = np.uint64(0x9E3779B97F4A7C15)
_PAGES, _HIGH, _FREE, _UNLOCKED = 0, 1, 2, 3  # meta: pages, entries ever used, free stacked, in the list


@njit(cache=True, inline="always")
def _shift(index: np.ndarray) -> np.uint64:
    bits, size = 0, len(index)
    while size > 1:
        size >>= 1
        bits += 1
    return np.uint64(64 - bits)


@njit(cache=True, inline="always")
def _home(k: np.uint64, shift: np.uint64) -> int:
    return np.int64((k * _FIB) >> shift)


@njit(cache=True)
def _find(index: np.ndarray, keys: np.ndarray, k: np.uint64, shift: np.uint64) -> int:
    i = _home(k, shift)
    while True:
        node = index[i]
        if node == 0 or keys[node] == k:
            return node
        i = (i + 1) & (len(index) - 1)


@njit(cache=True)
def _index(index: np.ndarray, keys: np.ndarray, node: int, shift: np.uint64) -> None:
    i = _home(keys[node], shift)
    while index[i] != 0:
        i = (i + 1) & (len(index) - 1)
    index[i] = node


@njit(cache=True)
def _unindex(index: np.ndarray, keys: np.ndarray, node: int, shift: np.uint64) -> None:
    """Remove ``node``, shifting back the entries probed past it."""
    mask = len(index) - 1
    i = _home(keys[node], shift)
    while index[i] != node:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        other = index[j]
        if other == 0:
            break
        h = _home(keys[other], shift)
        if (i < j and i < h <= j) or (i > j and (h > i or h <= j)):  # its home in (i, j]: stays
            continue
        index[i] = other
        i = j
    index[i] = 0


@njit(cache=True, inline="always")
def _unlink(prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    p, n = prev[node], nxt[node]
    nxt[p] = n
    prev[n] = p


@njit(cache=True, inline="always")
def _append(prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    last = prev[0]
    prev[node], nxt[node] = last, 0
    nxt[last] = node
    prev[0] = node


@njit(cache=True)
def _rehash(index: np.ndarray, keys: np.ndarray, refs: np.ndarray, high: int) -> None:
    shift = _shift(index)
    for node in range(1, high + 1):
        if refs[node] >= 0:
            _index(index, keys, node, shift)


@njit(cache=True)
def _match(meta: np.ndarray, index: np.ndarray, keys: np.ndarray, refs: np.ndarray, prev: np.ndarray,
           nxt: np.ndarray, q: np.ndarray, limit: int) -> int:
    shift = _shift(index)
    n = 0
    while n < len(q) and n < limit and _find(index, keys, q[n], shift) != 0:
        n += 1
    for i in range(n - 1, -1, -1):  # last first: a parent ends up more recent than its children
        node = _find(index, keys, q[i], shift)
        if refs[node] == 0:
            _unlink(prev, nxt, node)
            _append(prev, nxt, node)
    return n


@njit(cache=True)
def _lock(meta: np.ndarray, index: np.ndarray, keys: np.ndarray, refs: np.ndarray, prev: np.ndarray,
          nxt: np.ndarray, q: np.ndarray) -> int:
    """Returns the position of a key not cached (-1: none)."""
    shift = _shift(index)
    for i in range(len(q)):
        node = _find(index, keys, q[i], shift)
        if node == 0:
            return i
        if refs[node] == 0:
            _unlink(prev, nxt, node)
            meta[_UNLOCKED] -= 1
        refs[node] += 1
    return -1


@njit(cache=True)
def _unlock(meta: np.ndarray, index: np.ndarray, keys: np.ndarray, refs: np.ndarray, prev: np.ndarray,
            nxt: np.ndarray, q: np.ndarray) -> int:
    """Returns the position of a key not cached or not locked (-1: none)."""
    shift = _shift(index)
    for i in range(len(q) - 1, -1, -1):
        node = _find(index, keys, q[i], shift)
        if node == 0 or refs[node] == 0:
            return i
        refs[node] -= 1
        if refs[node] == 0:
            _append(prev, nxt, node)
            meta[_UNLOCKED] += 1
    return -1


@njit(cache=True)
def _insert(meta: np.ndarray, index: np.ndarray, keys: np.ndarray, refs: np.ndarray, prev: np.ndarray,
            nxt: np.ndarray, free: np.ndarray, q: np.ndarray) -> int:
    """Each key, last first, added unlocked or (unlocked and present) made most recent;
    returns how many were new. The arrays have room for every key to be new."""
    shift = _shift(index)
    new = 0
    for i in range(len(q) - 1, -1, -1):
        node = _find(index, keys, q[i], shift)
        if node == 0:
            if meta[_FREE] > 0:
                meta[_FREE] -= 1
                node = free[meta[_FREE]]
            else:
                meta[_HIGH] += 1
                node = meta[_HIGH]
            keys[node], refs[node] = q[i], 0
            _index(index, keys, node, shift)
            meta[_PAGES] += 1
            meta[_UNLOCKED] += 1
            new += 1
        elif refs[node] == 0:
            _unlink(prev, nxt, node)
        else:
            continue
        _append(prev, nxt, node)
    return new


@njit(cache=True)
def _evict(meta: np.ndarray, index: np.ndarray, keys: np.ndarray, refs: np.ndarray, prev: np.ndarray,
           nxt: np.ndarray, free: np.ndarray, n: int) -> None:
    shift = _shift(index)
    for _ in range(n):
        node = nxt[0]
        _unlink(prev, nxt, node)
        _unindex(index, keys, node, shift)
        refs[node] = -1
        free[meta[_FREE]] = node
        meta[_FREE] += 1
        meta[_PAGES] -= 1
        meta[_UNLOCKED] -= 1


def _as_keys(keys: Sequence[int]) -> np.ndarray:
    try:
        return np.array(keys, dtype=np.uint64)
    except OverflowError:  # a negative key: its low 64 bits
        return np.array([k & _MASK for k in keys], dtype=np.uint64)


class PrefixCache:
    def __init__(self, *, page: int, enabled: bool = True) -> None:
        self.page = page
        self.enabled = enabled
        self.hits = 0
        self.queries = 0
        self._empty()

    def _empty(self) -> None:
        self._meta = np.zeros(4, dtype=np.int64)
        self._keys = np.zeros(1, dtype=np.uint64)
        self._refs, self._prev, self._next, self._free = (np.zeros(1, dtype=np.int64) for _ in range(4))
        self._index = np.zeros(2, dtype=np.int64)

    def _room(self, n: int) -> None:
        """Entries for ``n`` more pages."""
        old = len(self._keys)
        if self._meta[_PAGES] + n < old:
            return
        cap = max(2 * old, int(self._meta[_PAGES]) + n + 1)
        keys, refs = np.zeros(cap, dtype=np.uint64), np.full(cap, -1, dtype=np.int64)
        keys[:old], refs[:old] = self._keys, self._refs
        self._keys, self._refs = keys, refs
        for name in ("_prev", "_next", "_free"):
            grown = np.zeros(cap, dtype=np.int64)
            grown[:old] = getattr(self, name)
            setattr(self, name, grown)
        self._index = np.zeros(1 << (2 * cap - 1).bit_length(), dtype=np.int64)  # at most half full
        _rehash(self._index, self._keys, self._refs, int(self._meta[_HIGH]))

    @property
    def tokens(self) -> int:
        return int(self._meta[_PAGES]) * self.page

    @property
    def evictable_tokens(self) -> int:
        return int(self._meta[_UNLOCKED]) * self.page

    def match(self, keys: Sequence[int], limit_tokens: int) -> int:
        """Number of leading pages of ``keys`` present (at most ``limit_tokens`` worth)."""
        if not self.enabled or not len(keys):
            return 0
        return _match(self._meta, self._index, self._keys, self._refs, self._prev, self._next,
                      _as_keys(keys), limit_tokens // self.page)

    def record(self, hit_tokens: int, total_tokens: int) -> None:
        self.hits += hit_tokens
        self.queries += total_tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def lock(self, keys: Sequence[int]) -> None:
        if len(keys):
            missing = _lock(self._meta, self._index, self._keys, self._refs, self._prev, self._next, _as_keys(keys))
            if missing >= 0:
                raise KeyError(keys[missing])

    def unlock(self, keys: Sequence[int]) -> None:
        if len(keys):
            bad = _unlock(self._meta, self._index, self._keys, self._refs, self._prev, self._next, _as_keys(keys))
            if bad >= 0:
                raise RuntimeError(f"prefix cache refcount underflow (page {keys[bad]} is not locked)")

    def insert(self, keys: Sequence[int]) -> int:
        """Add pages (unlocked); returns how many were new. As if each key, last first, were
        added or (unlocked and present) made most recent, one at a time."""
        if not self.enabled or not len(keys):
            return 0
        self._room(len(keys))
        return _insert(self._meta, self._index, self._keys, self._refs, self._prev, self._next, self._free,
                       _as_keys(keys))

    def evict(self, tokens: int) -> int:
        """Evict unlocked pages, oldest first, until ``tokens`` are freed; returns freed."""
        n = min(int(self._meta[_UNLOCKED]), max(0, -(-tokens // self.page)))
        if n:
            _evict(self._meta, self._index, self._keys, self._refs, self._prev, self._next, self._free, n)
        return n * self.page

    def flush(self) -> bool:
        """Drop every unlocked page; SGLang refuses while requests hold pages."""
        if self._meta[_UNLOCKED] != self._meta[_PAGES]:
            return False
        self._empty()
        return True

    def pages(self) -> dict[int, int]:
        """Cached page key -> how many requests lock it."""
        live = np.flatnonzero(self._refs >= 0)
        live = live[live > 0]
        return dict(zip(self._keys[live].tolist(), self._refs[live].tolist()))

    def unlocked(self) -> list[int]:
        """The evictable pages' keys, least recently used first."""
        out, node = [], int(self._next[0])
        while node:
            out.append(int(self._keys[node]))
            node = int(self._next[node])
        return out


def warm() -> None:
    """Load (or compile, once per machine) the kernels, as a worker starts: a first
    compile takes seconds, which the first request would otherwise wait in the engine."""
    cache = PrefixCache(page=1)
    cache.insert([1, 2])
    cache.match([1, 2], 2)
    cache.lock([1])
    cache.unlock([1])
    cache.evict(2)
