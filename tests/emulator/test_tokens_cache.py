"""Pure pieces: the token function, the context hash, the prefix cache, the link."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang.emulator.prefix_cache import PrefixCache
from pearl_sglang.emulator.prompt_ids import PromptIds
from pearl_sglang.emulator.stats import Stats
from pearl_sglang.emulator.tokens import (TokenSpace, block_hashes, extend_block_hashes, extend_hash,
                                          hash_tokens, prompt_hashes, version_salt)
from pearl_sglang.emulator.transfer import SharedLink

tokens = st.lists(st.integers(0, 150_000), max_size=300)


@given(tokens, tokens)
def test_bulk_hash_equals_incremental(a: list[int], b: list[int]) -> None:
    h = 0
    for t in a + b:
        h = extend_hash(h, t)
    assert hash_tokens(a + b) == h
    assert hash_tokens(b, hash_tokens(a)) == h


@given(tokens, st.integers(1, 32))
def test_block_hashes_are_prefix_hashes(a: list[int], page: int) -> None:
    keys = block_hashes(a, page)
    assert len(keys) == len(a) // page
    for i, k in enumerate(keys):
        assert k == hash_tokens(a[: (i + 1) * page])


@given(tokens, st.integers(0, 900), st.integers(0, 2**32 - 1), st.integers(1, 32))
def test_extended_block_hashes_continue_the_chain(a: list[int], n: int, seed: int, page: int) -> None:
    """Keys of ``a`` continued by the tokens after its last full page: the keys of ``a + b``,
    for tails on both sides of the loop / numpy cut."""
    b = np.random.default_rng(seed).integers(0, 150_000, size=n).tolist()
    keys = block_hashes(a, page)
    tail = a[len(keys) * page:] + b
    assert extend_block_hashes(keys, page, tail) == block_hashes(a + b, page)
    for i, k in enumerate(block_hashes(tail, page, hash_tokens(a[:len(keys) * page]))):
        assert k == hash_tokens(a[:len(keys) * page] + tail[:(i + 1) * page])


def test_next_token_avoids_specials_and_eos() -> None:
    space = TokenSpace(vocab_size=64, eos_token_id=5, special_ids=frozenset({0, 1, 2}), low=0)
    salt = version_salt("v1")
    seen = {space.next_token(h, salt) for h in range(5000)}
    assert not seen & {0, 1, 2, 5}
    assert len(seen) > 50


def test_tokens_depend_on_version_and_context() -> None:
    space = TokenSpace(vocab_size=150_000, eos_token_id=0)
    h = hash_tokens([1, 2, 3])
    a, b = version_salt("v1"), version_salt("v2")
    assert space.next_token(h, a) == space.next_token(hash_tokens([1, 2, 3]), a)
    diffs = sum(space.next_token(hash_tokens([i]), a) != space.next_token(hash_tokens([i]), b)
                for i in range(100))
    assert diffs > 95


def test_eos_probability_is_respected() -> None:
    space = TokenSpace(vocab_size=1000, eos_token_id=0, eos_probability=0.05)
    salt = version_salt("v")
    rate = sum(space.wants_eos(hash_tokens([i]), salt) for i in range(20_000)) / 20_000
    assert 0.04 < rate < 0.06


@settings(max_examples=60, deadline=None)  # the first example loads the compiled cache
@given(st.lists(st.tuples(st.sampled_from("mlue"), st.integers(0, 6), st.integers(1, 5)), max_size=60))
def test_prefix_cache_invariants(ops: list[tuple[str, int, int]]) -> None:
    cache = PrefixCache(page=4)
    chains = [[hash((c, i)) for i in range(8)] for c in range(7)]
    locked: list[list[int]] = []
    for op, c, n in ops:
        keys = chains[c][:n]
        if op == "m":
            got = cache.match(keys, 1000)
            assert got <= n
        elif op == "l":
            m = cache.match(keys, 1000)
            cache.lock(keys[:m])
            locked.append(keys[:m])
        elif op == "u" and locked:
            cache.unlock(locked.pop())
        elif op == "e":
            cache.evict(n * 4)
        cache.insert(keys) if op == "m" else None
        assert cache.evictable_tokens <= cache.tokens
        for ks in locked:  # locked pages survive eviction
            assert cache.match(ks, 1000) == len(ks)


def test_prefix_cache_evicts_leaves_first() -> None:
    cache = PrefixCache(page=1)
    cache.insert([1, 2, 3])
    cache.evict(1)
    assert cache.match([1, 2, 3], 10) == 2


def test_shared_link_processor_sharing() -> None:
    link = SharedLink(bandwidth=100.0, latency_s=0.0)
    link.add("a", 100.0, 0.0)
    link.add("b", 100.0, 0.0)
    assert abs(link.next_completion() - 2.0) < 1e-9
    link.add("c", 50.0, 1.0)  # a, b have 50 left; all three share from t=1
    t = link.next_completion()
    assert abs(t - 2.5) < 1e-9
    assert sorted(link.pop_completed(t)) == ["a", "b", "c"]


def test_growing_text_equals_decoding_the_whole_output_each_time():
    from pearl_sglang.emulator.codec import GrowingText, TextCodec

    codec = TextCodec(None)
    growing = GrowingText(codec)
    ids: list[int] = []
    for chunk in ([300, 301], [], [70000, 259, 151000], [65, 0xC3], [0xA9, 400], [258, 500]):
        ids = ids + chunk  # a byte id and a special id switch it to whole decoding
        assert growing.decode(ids) == codec.decode(ids)
    assert growing.decode(ids[:-1]) == codec.decode(ids[:-1])  # a trimmed final output
    fresh = GrowingText(codec)
    assert fresh.decode([300, 301]) == " t300 t301" and fresh.decode([300]) == " t300"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(256, (1 << 18) + 3), max_size=40))
def test_the_fast_text_path_renders_each_generated_id_as_the_byte_path_does(ids):
    from pearl_sglang.emulator.codec import TextCodec

    fast = TextCodec(None).generated_text(ids)
    if ids and min(ids) >= 259 and max(ids) < 1 << 18:
        assert fast == "".join(f" t{i}" for i in ids)
    else:
        assert fast is None


def test_byte_codec_encodes_specials_as_one_id_and_the_rest_as_utf8_bytes():
    from pearl_sglang.emulator.codec import TextCodec

    codec = TextCodec(None)
    assert codec.encode("ab<|im_start|>é<|im_end|><|x<|endoftext|>") == [
        97, 98, 257, 195, 169, 258, 60, 124, 120, 256]
    assert codec.encode("") == [] and codec.decode(codec.encode("plain text, 中")) == "plain text, 中"


@given(st.lists(st.integers(min_value=-3, max_value=(1 << 64) - 1), min_size=4, max_size=80),
       st.sampled_from([1, 4, 16]), st.sampled_from([list, tuple]))
@settings(max_examples=200, deadline=None)
def test_block_hashes_convert_any_ids_as_uint64_would(ids: list[int], page: int, kind: type) -> None:
    """The int64 fast path gives the keys (or the error) of the plain uint64 conversion,
    for ids int64 cannot hold and negative ones too."""
    def direct() -> list[int]:
        n = len(ids) // page * page
        ref = [hash_tokens(np.asarray(ids[:(b + 1) * page], dtype=np.uint64)) for b in range(n // page)]
        return ref

    try:
        want: object = direct()
    except OverflowError:
        want = OverflowError
    try:
        got: object = block_hashes(kind(ids), page)
    except OverflowError:
        got = OverflowError
    assert got == want


def test_a_decode_run_records_what_its_iterations_would() -> None:
    ends = [0.1 * k + 0.013 * (k % 3) for k in range(1, 120)]
    durations = [e - (ends[i - 1] if i else 0.0) for i, e in enumerate(ends)]
    one, run = Stats(), Stats()
    for t, d in zip(ends[:7], durations[:7]):
        one.record(t, d, 5, prefill_tokens=40)
        run.record(t, d, 5, prefill_tokens=40)
    for t, d in zip(ends[7:], durations[7:]):
        one.record(t, d, 9)
    run.record_decode_run(ends[7:60], durations[7:60], 9)
    run.record_decode_run(ends[60:], durations[60:], 9)
    assert vars(one) == vars(run)


def test_prompt_ids_read_as_a_tuple_of_ints_and_hash_the_same() -> None:
    ids = PromptIds(np.array([7, 2**64 - 1, 0], dtype=np.uint64))
    assert ids == (7, 2**64 - 1, 0) and ids == [7, 2**64 - 1, 0] and ids != (7,)
    assert ids[1:] == [2**64 - 1, 0] and type(ids[0]) is int and list(ids) == [7, 2**64 - 1, 0]
    assert ids == PromptIds(np.array([7, 2**64 - 1, 0], dtype=np.uint64)) and len(ids) == 3
    with pytest.raises(ValueError):
        ids.array[0] = 1  # read-only: a request's prompt does not change under the engine
    with pytest.raises(TypeError, match="uint64"):
        PromptIds(np.array([1, 2], dtype=np.int64))
    prompt = list(range(10, 10 + 3 * 16 + 5))
    assert prompt_hashes(PromptIds(np.array(prompt, dtype=np.uint64)), 16) == prompt_hashes(tuple(prompt), 16)


class _OneKeyAtATime:
    """The cache's rule, one page at a time in Python dicts (what it was before it was compiled)."""

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()

    def insert(self, keys: list[int]) -> int:
        new = 0
        for k in reversed(keys):
            if k in self.refs:
                if k in self.lru:
                    self.lru.move_to_end(k)
                continue
            self.refs[k] = 0
            self.lru[k] = None
            new += 1
        return new

    def lock(self, keys: list[int]) -> None:
        for k in keys:
            if self.refs[k] == 0:
                del self.lru[k]
            self.refs[k] += 1

    def unlock(self, keys: list[int]) -> None:
        for k in reversed(keys):
            self.refs[k] -= 1
            if self.refs[k] == 0:
                self.lru[k] = None

    def match(self, keys: list[int], limit: int) -> int:
        n = 0
        while n < min(len(keys), limit) and keys[n] in self.refs:
            n += 1
        for k in reversed(keys[:n]):
            if k in self.lru:
                self.lru.move_to_end(k)
        return n

    def evict(self, n: int) -> int:
        n = min(n, len(self.lru))
        for _ in range(n):
            k, _ = self.lru.popitem(last=False)
            del self.refs[k]
        return n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ilume"), st.lists(st.integers(0, 12), max_size=10)), max_size=40))
def test_the_cache_is_the_one_key_at_a_time_rule(ops: list[tuple[str, list[int]]]) -> None:
    """Pages added, made recent, left alone while locked, repeated keys, matched, evicted:
    the compiled cache leaves the same pages, locks and LRU order as the rule applied one
    key at a time, and counts the same new ones."""
    fast, slow = PrefixCache(page=1), _OneKeyAtATime()
    locked: list[list[int]] = []
    for op, keys in ops:
        if op == "i":
            assert fast.insert(keys) == slow.insert(keys)
        elif op == "l":
            held = [k for k in dict.fromkeys(keys) if k in slow.refs]
            fast.lock(held)
            slow.lock(held)
            locked.append(held)
        elif op == "u" and locked:
            held = locked.pop()
            fast.unlock(held)
            slow.unlock(held)
        elif op == "m":
            assert fast.match(keys, 7) == slow.match(keys, 7)
        elif op == "e":
            assert fast.evict(len(keys)) == slow.evict(len(keys))
        assert fast.unlocked() == list(slow.lru) and fast.pages() == slow.refs
        assert fast.tokens == len(slow.refs) and fast.evictable_tokens == len(slow.lru)


def test_a_cache_of_thousands_of_pages_keeps_the_rule() -> None:
    """Many pages through a cache that evicts as it fills: the hash index's deletions
    (entries shifted back over the gap) and growth keep every page findable."""
    import random
    rnd = random.Random(3)
    fast, slow = PrefixCache(page=1), _OneKeyAtATime()
    prompts: list[list[int]] = []
    for _ in range(400):
        base = rnd.choice(prompts)[:rnd.randrange(50)] if prompts and rnd.random() < 0.5 else []
        keys = base + [rnd.getrandbits(64) for _ in range(rnd.randrange(1, 200))]
        prompts.append(keys)
        assert fast.match(keys, 10**9) == slow.match(keys, 10**9)
        assert fast.insert(keys) == slow.insert(keys)
        if len(slow.refs) > 3000:
            assert fast.evict(len(slow.refs) - 2000) == slow.evict(len(slow.refs) - 2000)
    assert fast.unlocked() == list(slow.lru) and fast.pages() == slow.refs


def test_unlocking_a_page_not_locked_is_an_error() -> None:
    cache = PrefixCache(page=1)
    cache.insert([1, 2])
    with pytest.raises(RuntimeError, match="underflow"):
        cache.unlock([1])
    with pytest.raises(KeyError):
        cache.lock([3])


def test_a_streams_text_holds_back_an_incomplete_last_character_as_sglang_does():
    # Found by fuzzing: the emulator sent "a\ufffd" then "aé"; SGLang's detokenizer holds the
    # character back, so a stream's text only grows (clients send it as increments).
    from pearl_sglang.emulator.codec import TextCodec
    from pearl_sglang.emulator.http_parse import output_text
    from pearl_sglang.emulator.request import FinishReason, RequestHandle, SamplingParams

    codec, sp = TextCodec(None), SamplingParams()
    handle = RequestHandle(rid="r", prompt_tokens=1, arrival_time=0.0, output_ids=[97, 0xC3])
    assert output_text(codec, handle, sp) == "a"
    handle.output_ids.append(0xA9)
    assert output_text(codec, handle, sp) == "aé"
    handle.output_ids[-1] = 0xC3
    handle.finish_reason = FinishReason("length", length=3)
    assert output_text(codec, handle, sp) == "a\ufffd\ufffd"  # a final text is decoded whole
