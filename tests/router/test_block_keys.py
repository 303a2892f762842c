"""Block keys: the same from a request's id text and from an array, chained, and moved
by any changed id."""
from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings, strategies as st

from pearl_sglang.router import block_keys
from pearl_sglang.router.encoded_ids import comma_positions

BLOCK = 8
# Every digit count a canonical id can have (1 to 19), weighted to the vocabulary's.
_IDS = st.one_of(st.integers(0, 200_000), st.integers(0, 10**19 - 1))


def _text(ids: list[int]) -> bytes:
    return orjson.dumps(ids)[1:-1]


@settings(max_examples=120, deadline=None)
@given(st.lists(_IDS, min_size=1, max_size=6 * BLOCK), st.integers(0, 6 * BLOCK))
def test_text_and_array_give_the_same_chained_keys(ids: list[int], cut: int) -> None:
    text = _text(ids)
    keys = block_keys.of_text(text, comma_positions(text), BLOCK)
    arr = np.array(ids, dtype=np.uint64)
    assert keys == block_keys.of_ids(arr, BLOCK)
    assert len(keys) == len(ids) // BLOCK
    k = min(cut, len(ids)) // BLOCK  # continuing after k blocks gives the rest
    assert block_keys.of_ids(arr[k * BLOCK:], BLOCK, keys[k - 1] if k else 0) == keys[k:]
    rest = _text(ids[k * BLOCK:])
    assert block_keys.of_text(rest, comma_positions(rest), BLOCK, keys[k - 1] if k else 0) == keys[k:]


@settings(max_examples=120, deadline=None)
@given(st.lists(_IDS, min_size=BLOCK, max_size=4 * BLOCK), st.data())
def test_a_changed_id_changes_its_block_and_every_later_key(ids: list[int], data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(ids) - 1))
    other = data.draw(_IDS.filter(lambda v: v != ids[at]))
    changed = ids[:at] + [other] + ids[at + 1:]
    before = block_keys.of_ids(np.array(ids, dtype=np.uint64), BLOCK)
    after = block_keys.of_ids(np.array(changed, dtype=np.uint64), BLOCK)
    same = at // BLOCK
    assert after[:same] == before[:same]
    assert all(a != b for a, b in zip(after[same:], before[same:]))


def test_a_chain_continues_from_any_int_key():
    """Text prompts are keyed by Python's (signed) hash: a prompt + output key extends
    from one, as from an id key (a negative start once made the router answer 500)."""
    ids = np.arange(3 * BLOCK, dtype=np.uint64)
    for h in (-1, -(2**63), 2**64 - 1, 2**70 + 5, 0):
        keys = block_keys.of_ids(ids, BLOCK, h)
        assert len(keys) == 3 and keys == block_keys.of_ids(ids, BLOCK, h)
        assert all(0 <= k < 2**64 for k in keys)
    assert block_keys.of_ids(ids, BLOCK, -1) == block_keys.of_ids(ids, BLOCK, 2**64 - 1)
