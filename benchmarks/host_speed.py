"""How fast this host runs the replay's kind of work right now: a fixed probe's CPU seconds.

On these shared machines the same replay of the same code takes up to twice the CPU
seconds at one hour as at another (other tenants share the physical cores and caches;
``/proc/stat`` shows almost no steal). ``replay_cpu.py`` runs this probe in a fresh process
beside every replay, so each measurement carries the host's speed when it was taken, and
CPU seconds from different hours can be told apart from changes in the code.

The probe is fixed work of the kinds a replay's profile is made of: an ``OrderedDict`` LRU
of integer keys (the router's prefix map, the engines' caches), bytes slices hashed (block
hashes), numpy passes over a turn-sized id array, and small objects made and dropped
(requests, chunks). It never changes with the product's code.

    .venv/bin/python -m benchmarks.host_speed [--repeat 3]
"""
from __future__ import annotations

import argparse
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import islice

import numpy as np

_IDS = 30_000       # a long agentic turn's context
_BLOCK = 64
_LRU_LIMIT = 1 << 16


@dataclass
class _Item:
    key: int
    size: int
    owner: int


def _lru(rounds: int) -> int:
    lru: OrderedDict[int, int] = OrderedDict()
    h = 0
    for r in range(rounds):
        keys = [hash((r, i)) for i in range(_IDS // _BLOCK)]
        lru.update(zip(keys, range(len(keys))))
        deque(map(lru.move_to_end, keys[: len(keys) // 4]), maxlen=0)
        excess = len(lru) - _LRU_LIMIT
        if excess > 0:
            deque(map(lru.pop, list(islice(lru, excess))), maxlen=0)
        h ^= len(lru)
    return h


def _hashes(rounds: int, text: bytes) -> int:
    h = 0
    width = len(text) // (_IDS // _BLOCK)
    for _ in range(rounds):
        for start in range(0, len(text) - width, width):
            h = hash((h, text[start:start + width]))
    return h


def _arrays(rounds: int, ids: np.ndarray) -> int:
    total = 0
    for _ in range(rounds):
        text = ids.tobytes()
        total += int(np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 44).size)
        total += int(np.cumsum(ids, dtype=np.uint64)[-1] & np.uint64(0xFFFF))
        total += int(np.concatenate([ids[: _IDS // 10], ids]).max())
    return total


def _objects(rounds: int) -> int:
    kept: deque[_Item] = deque(maxlen=512)
    s = 0
    for i in range(rounds * 2000):
        item = _Item(key=i, size=i % 97, owner=i % 7)
        kept.append(item)
        s += item.size * 1.5 > item.owner
    return s


def probe() -> float:
    """CPU seconds of the fixed work (about half a second on a quiet host)."""
    ids = (np.arange(_IDS, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(151_000)
    text = b",".join(str(int(i)).encode() for i in ids[:4000])
    start = time.process_time()
    _lru(600)
    _hashes(900, text)
    _arrays(500, ids)
    _objects(80)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    for _ in range(args.repeat):
        print(f"{probe():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
