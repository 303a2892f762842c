"""Which workers hold which prompt blocks: the router's learned prefix map, compiled.

A block key (``block_keys``) maps to the set of worker slots that served it and the
latest of them. The map is bounded and least-recently-used: ``remember`` adds a turn's
blocks tail first and refreshes the prefix its worker already held, first block last,
so eviction takes a key's tail before its head, as a radix cache evicts leaves, and what
a worker is believed to hold stays a prefix of the key. Each worker's count of blocks is
kept as blocks come and go.

An agentic turn adds a few hundred blocks (its context was rewritten or extended) and a
full map evicts as many; in a dict of Python objects that was about a microsecond a
block. Here a block is an entry of fixed arrays: a hash index (linear probing, deletion
by backward shift, so no tombstones), a recency list threaded through the entries, and
each entry's slots as a bit set of 64-slot words (widened when a higher slot appears).
Node 0 is the list's sentinel. Arrays grow, never shrink, as the map fills. The engine's
page cache (``emulator/prefix_cache.py``) keeps its own copy of the index's few functions:
the emulator imports nothing of the router, and numba's on-disk cache does not see a change
in a compiled function that another file's compiled code calls.

Keys are compared as 64-bit values: a key may be any int (a text prompt's keys are
Python's signed hashes); its low 64 bits are what is stored.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
from numba import njit

_MASK = (1 << 64) - 1
_FIB = np.uint64(0x9E3779B97F4A7C15)
_SIZE, _HIGH, _FREE = 0, 1, 2  # meta: entries held, nodes ever used, free nodes stacked


@njit(cache=True, inline="always")
def _home(k: np.uint64, shift: np.uint64) -> int:
    return np.int64((k * _FIB) >> shift)


@njit(cache=True, inline="always")
def _shift(index: np.ndarray) -> np.uint64:
    """64 - log2 of the index's size (a power of two): ``_home``'s shift."""
    bits, size = 0, len(index)
    while size > 1:
        size >>= 1
        bits += 1
    return np.uint64(64 - bits)


@njit(cache=True)
def _find(index: np.ndarray, keys: np.ndarray, k: np.uint64, shift: np.uint64) -> int:
    size = len(index)
    i = _home(k, shift)
    while True:
        node = index[i]
        if node == 0 or keys[node] == k:
            return node
        i = (i + 1) & (size - 1)


@njit(cache=True, inline="always")
def _holds(masks: np.ndarray, node: int, slot: int) -> bool:
    word = slot >> 6
    return word < masks.shape[1] and (masks[node, word] >> np.uint64(slot & 63)) & np.uint64(1) == np.uint64(1)


@njit(cache=True, inline="always")
def _unlink(prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    p, n = prev[node], nxt[node]
    nxt[p] = n
    prev[n] = p


@njit(cache=True, inline="always")
def _append(prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    """Make ``node`` the most recent (just before the sentinel)."""
    last = prev[0]
    prev[node] = last
    nxt[node] = 0
    nxt[last] = node
    prev[0] = node


@njit(cache=True)
def _insert(index: np.ndarray, keys: np.ndarray, node: int, shift: np.uint64) -> None:
    size = len(index)
    i = _home(keys[node], shift)
    while index[i] != 0:
        i = (i + 1) & (size - 1)
    index[i] = node


@njit(cache=True)
def _delete(index: np.ndarray, keys: np.ndarray, node: int, shift: np.uint64) -> None:
    """Remove ``node`` from the index, shifting back the entries probed past it."""
    size = len(index)
    i = _home(keys[node], shift)
    while index[i] != node:
        i = (i + 1) & (size - 1)
    j = i
    while True:
        j = (j + 1) & (size - 1)
        other = index[j]
        if other == 0:
            break
        h = _home(keys[other], shift)
        # ``other`` stays where it is if its home lies cyclically in (i, j]
        if (i < j and i < h <= j) or (i > j and (h > i or h <= j)):
            continue
        index[i] = other
        i = j
    index[i] = 0


@njit(cache=True)
def _rehash(index: np.ndarray, keys: np.ndarray, nxt: np.ndarray) -> None:
    shift = _shift(index)
    node = nxt[0]
    while node != 0:
        _insert(index, keys, node, shift)
        node = nxt[node]


@njit(cache=True)
def _held_blocks(index: np.ndarray, keys: np.ndarray, masks: np.ndarray, key: np.ndarray, slot: int,
                 shift: np.uint64) -> int:
    """How many leading blocks of ``key`` ``slot`` holds (a prefix: a binary search)."""
    n = len(key)
    if n == 0:
        return 0
    first = _find(index, keys, key[0], shift)
    if first == 0 or not _holds(masks, first, slot):
        return 0
    tail = _find(index, keys, key[n - 1], shift)
    if tail != 0 and _holds(masks, tail, slot):
        return n
    lo, hi = 0, n - 1  # slot holds key[lo], not key[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        node = _find(index, keys, key[mid], shift)
        if node != 0 and _holds(masks, node, slot):
            lo = mid
        else:
            hi = mid
    return lo + 1


@njit(cache=True)
def _matched(index: np.ndarray, keys: np.ndarray, masks: np.ndarray, key: np.ndarray,
             slots: np.ndarray) -> np.ndarray:
    out = np.zeros(len(slots), dtype=np.int64)
    shift = _shift(index)
    for j in range(len(slots)):
        out[j] = _held_blocks(index, keys, masks, key, slots[j], shift)
    return out


@njit(cache=True)
def _latest(index: np.ndarray, keys: np.ndarray, latest: np.ndarray, key: np.ndarray) -> int:
    shift = _shift(index)
    for i in range(len(key) - 1, -1, -1):
        node = _find(index, keys, key[i], shift)
        if node != 0:
            return latest[node]
    return -1


@njit(cache=True)
def _remember(meta: np.ndarray, index: np.ndarray, keys: np.ndarray, masks: np.ndarray, latest: np.ndarray,
              prev: np.ndarray, nxt: np.ndarray, free: np.ndarray, counts: np.ndarray,
              key: np.ndarray, slot: int, limit: int) -> int:
    """Add ``key``'s blocks for ``slot``; returns how many it did not hold before. The
    arrays have room for every block of ``key`` to be new."""
    shift = _shift(index)
    held = _held_blocks(index, keys, masks, key, slot, shift)
    word, bit = slot >> 6, np.uint64(1) << np.uint64(slot & 63)
    added = 0
    for i in range(len(key) - 1, held - 1, -1):  # tail first
        node = _find(index, keys, key[i], shift)
        if node == 0:
            if meta[_FREE] > 0:
                meta[_FREE] -= 1
                node = free[meta[_FREE]]
            else:
                meta[_HIGH] += 1
                node = meta[_HIGH]
            keys[node] = key[i]
            masks[node, :] = 0
            _insert(index, keys, node, shift)
            meta[_SIZE] += 1
        else:
            _unlink(prev, nxt, node)
        if masks[node, word] & bit == 0:
            masks[node, word] |= bit
            added += 1
        latest[node] = slot
        _append(prev, nxt, node)
    if held:
        latest[_find(index, keys, key[held - 1], shift)] = slot
        for i in range(held - 1, -1, -1):  # the prefix it held: recency only, first block last
            node = _find(index, keys, key[i], shift)
            if node != 0:
                _unlink(prev, nxt, node)
                _append(prev, nxt, node)
    counts[slot] += added
    while meta[_SIZE] > limit:  # least recent first
        node = nxt[0]
        _unlink(prev, nxt, node)
        _delete(index, keys, node, shift)
        for w in range(masks.shape[1]):
            m = masks[node, w]
            b = 0
            while m != 0:
                if m & np.uint64(1):
                    counts[w * 64 + b] -= 1
                m >>= np.uint64(1)
                b += 1
        free[meta[_FREE]] = node
        meta[_FREE] += 1
        meta[_SIZE] -= 1
    return added


def as_keys(key: tuple[int, ...]) -> np.ndarray:
    """A key's blocks as uint64 (any int: its low 64 bits)."""
    try:
        return np.array(key, dtype=np.uint64)
    except OverflowError:
        return np.array([k & _MASK for k in key], dtype=np.uint64)


class PrefixMap:
    """Block key -> the slots that served it and the latest one; at most ``limit`` keys."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a prefix map holds at least one block")
        self.limit = limit
        self._meta = np.zeros(3, dtype=np.int64)
        self._counts = np.zeros(64, dtype=np.int64)
        self._counted: set[int] = set()  # slots that were ever added blocks
        self._keys, self._masks = np.zeros(1, dtype=np.uint64), np.zeros((1, 1), dtype=np.uint64)
        self._latest, self._prev, self._next, self._free = (np.zeros(1, dtype=np.int64) for _ in range(4))
        self._index = np.zeros(2, dtype=np.int64)

    def _grow(self, nodes: int, words: int) -> None:
        """Room for ``nodes`` entries of ``words`` slot words; entries and recency kept."""
        old, cap = len(self._keys), nodes + 1  # node 0: the recency list's sentinel
        keys, masks = np.zeros(cap, dtype=np.uint64), np.zeros((cap, words), dtype=np.uint64)
        keys[:old], masks[:old, :self._masks.shape[1]] = self._keys, self._masks
        self._keys, self._masks = keys, masks
        for name in ("_latest", "_prev", "_next", "_free"):
            grown = np.zeros(cap, dtype=np.int64)
            grown[:old] = getattr(self, name)
            setattr(self, name, grown)
        self._index = np.zeros(1 << (2 * cap - 1).bit_length(), dtype=np.int64)  # at most half full
        _rehash(self._index, self._keys, self._next)

    def __len__(self) -> int:
        return int(self._meta[_SIZE])

    def held_tokens(self, key: np.ndarray, slots: list[int], block: int) -> dict[int, int]:
        """Tokens of ``key``'s prefix each of ``slots`` holds (those holding none left out)."""
        if not len(key) or not slots:
            return {}
        blocks = _matched(self._index, self._keys, self._masks, key, np.array(slots, dtype=np.int64))
        return {s: int(n) * block for s, n in zip(slots, blocks.tolist()) if n}

    def latest(self, key: np.ndarray) -> int | None:
        """The latest server of ``key``'s longest known prefix."""
        slot = _latest(self._index, self._keys, self._latest, key) if len(key) else -1
        return None if slot < 0 else int(slot)

    def remember(self, key: np.ndarray, slot: int) -> None:
        if slot < 0:
            raise ValueError(f"slot {slot} is negative")
        nodes, words, need = len(self._keys) - 1, self._masks.shape[1], len(self) + len(key)
        if need > nodes or slot >= 64 * words:  # every block may be new; evicted only after
            if need > nodes:
                nodes = max(min(2 * nodes, self.limit), need if need <= self.limit else need + len(key))
            self._grow(nodes, max(words, slot // 64 + 1))
        if slot >= len(self._counts):
            self._counts = np.concatenate([self._counts, np.zeros(slot + 1, dtype=np.int64)])
        if _remember(self._meta, self._index, self._keys, self._masks, self._latest, self._prev, self._next,
                     self._free, self._counts, key, slot, self.limit):
            self._counted.add(slot)

    def count(self, slot: int) -> int:
        """Blocks ``slot`` holds (0 for one never added any)."""
        return int(self._counts[slot]) if 0 <= slot < len(self._counts) else 0

    def counts(self) -> dict[int, int]:
        """Blocks each slot holds, for every slot that was ever added some."""
        return {s: int(self._counts[s]) for s in sorted(self._counted)}

    def entries(self) -> Iterator[tuple[int, frozenset[int], int]]:
        """(key, slots, latest slot), least recent first."""
        node = int(self._next[0])
        while node:
            mask = self._masks[node]
            slots = frozenset(w * 64 + b for w in range(len(mask)) for b in range(64) if int(mask[w]) >> b & 1)
            yield int(self._keys[node]), slots, int(self._latest[node])
            node = int(self._next[node])


def warm() -> None:
    """Load (or compile, once per machine) the kernels, as a server starts."""
    held = PrefixMap(1)
    key = as_keys((1, 2))
    held.remember(key, 0)
    held.held_tokens(key, [0], 1)
    held.latest(key)
