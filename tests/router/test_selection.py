"""The routing core's learned prefix affinity: the last server of a block owns it, the
most recently used blocks survive eviction, an explicit trajectory id wins."""
from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings, strategies as st

from pearl_sglang.core.state import Activity, Role, WorkerRecord, Zone
from pearl_sglang.router.selection import SelectionPolicy, Selector, Target

MASK = (1 << 64) - 1


def _on(slot: int) -> Target:
    return Target(worker=WorkerRecord(slot=slot, gpus=(f"n0:{slot}",), zone=Zone.DEDICATED,
                                      role=Role.COLOCATED, activity=Activity.ACTIVE))


def test_the_last_server_of_a_prefix_holds_it():
    sel = Selector()
    sel.remember(_on(1), (10, 11, 12))
    sel.remember(_on(2), (10, 11))            # a shorter shared prefix moves to worker 2
    assert sel.holder((10, 11, 12, 13)) == 1  # the longest known block decides
    assert sel.holder((10, 11)) == 2
    assert sel.holder((99,)) is None
    sel.remember(_on(3), (10,), trajectory="t")
    assert sel.holder((10, 11, 12), trajectory="t") == 3


def test_eviction_drops_the_least_recently_used_blocks_tail_first():
    """A key's blocks are refreshed together, its first block last, so eviction takes the
    tail of the least recently used key first (as a radix cache evicts leaves): what a
    worker is believed to hold stays a prefix."""
    sel = Selector(SelectionPolicy(max_prefix_blocks=4))
    sel.remember(_on(1), (1, 2, 3))
    sel.remember(_on(2), (4, 5))    # 5 blocks: block 3, the tail of the older key, goes
    assert sel.holder((3,)) is None and sel.holder((1, 2)) == 1
    sel.remember(_on(3), (2, 6))    # 2 is refreshed, so 1 goes next, not 2
    assert [sel.holder((b,)) for b in (1, 2, 4, 5, 6)] == [None, 3, 2, 2, 3]
    sel.remember(_on(1), tuple(range(100, 110)))  # more than the limit: only its first four stay
    assert [sel.holder((b,)) for b in (4, 100, 103, 104, 109)] == [None, 1, 1, None, None]


def _remember_block_by_block(blocks: OrderedDict, tree: dict, slot: int, key: tuple, held: int,
                             limit: int) -> None:
    """The rule ``remember`` keeps, one block at a time (what it did before it went to C)."""
    added = 0
    for h in reversed(key[held:]):
        owners = blocks.get(h)
        if owners is None:
            blocks[h] = {slot: None}
            added += 1
            continue
        if slot not in owners:
            owners[slot] = None
            added += 1
        elif len(owners) > 1:
            del owners[slot]
            owners[slot] = None
        blocks.move_to_end(h)
    if held:
        end = blocks[key[held - 1]]
        if len(end) > 1:
            del end[slot]
            end[slot] = None
        for h in reversed(key[:held]):
            blocks.move_to_end(h)
    if added:
        tree[slot] = tree.get(slot, 0) + added
    while len(blocks) > limit:
        _, owners = blocks.popitem(last=False)
        for s in owners:
            tree[s] -= 1


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 12),
       turns=st.lists(st.tuples(st.sampled_from([1, 2, 3, 70, 130]), st.lists(st.integers(0, 2), max_size=8)),
                      max_size=12))
def test_remember_keeps_the_block_by_block_rule(limit, turns):
    """Blocks, their owners and latest owner, recency and per-worker counts equal the
    one-block-at-a-time rule's after any sequence of turns (shared prefixes, eviction
    mid-turn). A turn's blocks are chained as real keys are: block i names the path up to
    it (Python's signed hashes: the map keeps their low 64 bits). Slots past 63 widen
    every block's slot set as they come."""
    sel = Selector(SelectionPolicy(max_prefix_blocks=limit))
    blocks: OrderedDict = OrderedDict()
    tree: dict = {}
    for slot, path in turns:
        key = tuple(hash(tuple(path[:i + 1])) for i in range(len(path)))
        held = sel.matched_tokens(key, {slot}).get(slot, 0) // 64
        _remember_block_by_block(blocks, tree, slot, key, held, limit)
        sel.remember(_on(slot), key)
        assert list(sel._blocks.entries()) == [(h & MASK, frozenset(o), list(o)[-1]) for h, o in blocks.items()]
        assert sel._blocks.counts() == dict(sorted(tree.items()))
        assert all(sel._blocks.count(s) == tree.get(s, 0) for s in range(-1, 140))


def test_a_full_map_of_long_keys_keeps_the_rule():
    """Thousands of blocks through a map a fraction their size: the hash index's
    deletions (entries shifted back over the gap) and growth keep every block findable."""
    import random
    rnd = random.Random(7)
    limit = 700
    sel = Selector(SelectionPolicy(max_prefix_blocks=limit))
    blocks: OrderedDict = OrderedDict()
    tree: dict = {}
    keys: list[tuple[int, ...]] = []
    for _ in range(300):
        if keys and rnd.random() < 0.5:  # a later turn: a known prefix, extended
            base = rnd.choice(keys)
            key = base[:rnd.randrange(len(base) + 1)] + tuple(rnd.getrandbits(64) for _ in range(rnd.randrange(1, 120)))
        else:
            key = tuple(rnd.getrandbits(64) for _ in range(rnd.randrange(1, 300)))
        keys.append(key)
        slot = rnd.randrange(6)
        held = sel.matched_tokens(key, {slot}).get(slot, 0) // 64
        _remember_block_by_block(blocks, tree, slot, key, held, limit)
        sel.remember(_on(slot), key)
    assert list(sel._blocks.entries()) == [(h, frozenset(o), list(o)[-1]) for h, o in blocks.items()]
    assert sel._blocks.counts() == dict(sorted(tree.items()))
    for key in keys[-50:]:
        assert sel.holder(key) == next((list(blocks[h])[-1] for h in reversed(key) if h in blocks), None)


def test_matched_tokens_is_the_prefix_each_worker_holds():
    sel = Selector()
    key = tuple(range(1, 11))
    sel.remember(_on(1), key)
    sel.remember(_on(2), key[:4])
    sel.remember(_on(3), key[:1])
    assert sel.matched_tokens(key, {1, 2, 3, 4}) == {1: 640, 2: 256, 3: 64}
    assert sel.matched_tokens(key, {2}) == {2: 256}
    assert sel.matched_tokens((99,) + key, {1, 2}) == {}


def test_a_mixed_pool_sends_requests_to_the_less_busy_side():
    """While a colocated <-> PD change runs in waves, colocated workers and PD pairs serve
    side by side: a request goes to whichever side is less busy, so neither the newly
    admitted workers nor the old ones still serving stay idle."""
    from pearl_sglang.core.placement import WorkerLoad
    from pearl_sglang.core.state import StateTable

    def worker(slot, role):
        return WorkerRecord(slot=slot, gpus=(f"n0:{slot}",), zone=Zone.DEDICATED, role=role,
                            activity=Activity.ACTIVE, endpoint=f"http://w{slot}",
                            bootstrap_port=9000 + slot if role is Role.PREFILL else None)

    table = StateTable.create(tp_size=1, dedicated_gpus={f"n0:{i}" for i in range(3)}, overlap_gpus=set(),
                              workers=[worker(0, Role.COLOCATED), worker(1, Role.PREFILL), worker(2, Role.DECODE)])
    sel = Selector()
    busy_colocated = {0: WorkerLoad(running=4), 2: WorkerLoad(running=1)}
    target = sel.choose(table, loads=busy_colocated, key=(1, 2))
    assert (target.prefill.slot, target.decode.slot) == (1, 2)
    busy_pair = {0: WorkerLoad(running=1), 2: WorkerLoad(running=3)}
    assert sel.choose(table, loads=busy_pair, key=(1, 2)).worker.slot == 0
    assert sel.choose(table, loads={}, key=(1, 2)).worker.slot == 0  # a tie keeps the colocated worker
    assert sel.choose(table, loads=busy_colocated, key=(1, 2), exclude={2}).worker.slot == 0


def test_isolated_placement_routes_colocated_and_pd_requests():
    """With the step's tail begun, placement takes the isolation cost term: a straggler's
    turn goes to the worker holding no other straggler, another request's turn stays off
    the workers stragglers run on; colocated and PD alike."""
    from pearl_sglang.core.placement import WorkerLoad
    from pearl_sglang.core.state import StateTable
    from pearl_sglang.core.straggler_isolation import Isolation

    def worker(slot, role):
        return WorkerRecord(slot=slot, gpus=(f"n0:{slot}",), zone=Zone.DEDICATED, role=role,
                            activity=Activity.ACTIVE, endpoint=f"http://w{slot}",
                            bootstrap_port=9000 + slot if role is Role.PREFILL else None)

    colocated = StateTable.create(tp_size=1, dedicated_gpus={"n0:0", "n0:1"}, overlap_gpus=set(),
                                  workers=[worker(0, Role.COLOCATED), worker(1, Role.COLOCATED)])
    sel = Selector()
    sel.remember(_on(0), (1, 2), trajectory="straggler")  # its home: worker 0, where stragglers run
    loads = {0: WorkerLoad(running=2), 1: WorkerLoad(running=2)}
    on_0 = {0: 2}
    assert sel.choose(colocated, loads=loads, key=(1, 2, 3), trajectory="other",
                      isolation=Isolation(straggler=False, stragglers_on=on_0)).worker.slot == 1
    assert sel.choose(colocated, loads=loads, key=(1, 2, 3), trajectory="straggler",
                      isolation=Isolation(straggler=True, stragglers_on=on_0)).worker.slot == 0  # its prefix
    pd = StateTable.create(tp_size=1, dedicated_gpus={f"n0:{i}" for i in range(3)}, overlap_gpus=set(),
                           workers=[worker(0, Role.PREFILL), worker(1, Role.DECODE), worker(2, Role.DECODE)])
    target = sel.choose(pd, loads={1: WorkerLoad(running=2), 2: WorkerLoad(running=2)}, key=(1, 2),
                        trajectory="other", isolation=Isolation(straggler=False, stragglers_on={1: 2}))
    assert (target.prefill.slot, target.decode.slot) == (0, 2)
