"""Per-worker prefix cache: page-granular, reference-counted, LRU eviction.

Stands in for SGLang's radix cache.  Keys are hashes of whole page-aligned prefixes
(``tokens.block_hashes``), so a key identifies a page together with everything before
it, exactly like a radix-tree path.  Pages used by a running request are locked; only
unlocked pages are evictable, least recently used first.  Because a match touches a
prefix from its end to its start, a parent page is always more recent than its
children, so eviction removes leaves before the pages they hang from.

Invariants (tested): ``tokens == pages * page``; ``evictable_tokens <= tokens``;
eviction never removes a locked page; a key's refcount never goes negative.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from itertools import compress, islice, repeat
from operator import not_


class PrefixCache:
    def __init__(self, *, page: int, enabled: bool = True) -> None:
        self.page = page
        self.enabled = enabled
        self._refs: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unlocked pages, oldest first
        self.hits = 0
        self.queries = 0

    @property
    def tokens(self) -> int:
        return len(self._refs) * self.page

    @property
    def evictable_tokens(self) -> int:
        return len(self._lru) * self.page

    def match(self, keys: list[int], limit_tokens: int) -> int:
        """Number of leading pages of ``keys`` present (at most ``limit_tokens`` worth)."""
        if not self.enabled:
            return 0
        n, limit = 0, limit_tokens // self.page
        refs = self._refs
        for k in keys:
            if n >= limit or k not in refs:
                break
            n += 1
        for k in reversed(keys[:n]):
            if k in self._lru:
                self._lru.move_to_end(k)
        return n

    def record(self, hit_tokens: int, total_tokens: int) -> None:
        self.hits += hit_tokens
        self.queries += total_tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def lock(self, keys: list[int]) -> None:
        for k in keys:
            r = self._refs[k]
            if r == 0:
                del self._lru[k]
            self._refs[k] = r + 1

    def unlock(self, keys: list[int]) -> None:
        for k in reversed(keys):
            r = self._refs[k] - 1
            if r < 0:
                raise RuntimeError("prefix cache refcount underflow")
            self._refs[k] = r
            if r == 0:
                self._lru[k] = None

    def insert(self, keys: list[int]) -> int:
        """Add pages (unlocked); returns how many were new. As if each key, last first, were
        added or (unlocked and present) made most recent, one at a time; the loops run in C."""
        if not self.enabled:
            return 0
        refs, lru = self._refs, self._lru
        last_first = keys[::-1]  # a prompt's keys are chained: none repeats
        before = len(refs)
        unlocked = list(compress(last_first, map(not_, map(refs.setdefault, last_first, repeat(0)))))
        new = len(refs) - before
        lru.update(zip(unlocked, repeat(None)))
        if new < len(unlocked):  # some were present and unlocked: the new and those, in order, last
            deque(map(lru.move_to_end, unlocked), maxlen=0)
        return new

    def evict(self, tokens: int) -> int:
        """Evict unlocked pages, oldest first, until ``tokens`` are freed; returns freed."""
        n = min(len(self._lru), max(0, -(-tokens // self.page)))
        gone = list(islice(self._lru, n))
        deque(map(self._lru.pop, gone), maxlen=0)
        deque(map(self._refs.pop, gone), maxlen=0)
        return n * self.page

    def flush(self) -> bool:
        """Drop every unlocked page; SGLang refuses while requests hold pages."""
        if len(self._lru) != len(self._refs):
            return False
        self._refs.clear()
        self._lru.clear()
        return True
