"""Decode stretches change how many events the engine runs, never what it computes.

One scenario runs twice on virtual time, once per stepping mode, and everything anyone
can observe must be equal: every request's tokens, log-probabilities, finish and
first-token times, weight-version spans and retractions; each stream's wake-ups; the
load snapshots read in the middle of decode runs; the engines' counters.  The scenario
has what ends a stretch: arrivals, aborts, EOS and stop ids, length limits, a weight
version change, a pause, KV pressure with retractions, a full waiting queue, and a PD
pair whose transfers and timers are engine events.
"""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from benchmarks.harness.virtual_cluster import VirtualCluster
from pearl_sglang.emulator import (Bootstrap, DisaggregationMode, EngineConfig, GenerateRequest, SamplingParams,
                                   load_profile)
from pearl_sglang.emulator.stretch_draws import draw_runs
from pearl_sglang.emulator.tokens import BASE, MASK, TokenSpace, draw

TINY = load_profile("tiny")
CHATTY = TINY.replace(eos_probability=0.02)  # many EOS finishes among ignore_eos=False requests


def _prompt(i: int, n: int) -> tuple[int, ...]:
    return tuple(300 + (i * 37 + k * 11) % 700 for k in range(n))


class _Stream:
    """A reader that wants a chunk every ``interval`` tokens, as ``runs.Run`` does."""

    def __init__(self, clock, interval: int) -> None:
        self.clock, self.interval, self.wakes = clock, interval, []

    def __call__(self, h) -> None:
        if h.finish_reason is not None or len(h.output_ids) >= h.notify_at:
            self.wakes.append((len(h.output_ids), self.clock.now()))
            h.notify_at = len(h.output_ids) + self.interval


def scenario(stretches: bool) -> tuple[dict, int]:
    c = VirtualCluster()
    events = [0]

    def engine(profile, **kw):
        e = c.add_engine(profile, EngineConfig(decode_stretches=stretches, **kw))
        process = e._process

        def counted(t: float) -> None:
            events[0] += 1
            process(t)
        e._process = counted
        return e

    tight = engine(TINY, max_total_tokens=1800, max_running_requests=6)  # KV pressure, full queue
    chatty = engine(CHATTY)
    prefill = engine(TINY, role=DisaggregationMode.PREFILL, bootstrap_port=9200, pd_timeout_s=3.0)
    decode = engine(TINY, role=DisaggregationMode.DECODE, bootstrap_port=9201)
    handles, streams, loads = {}, {}, []

    def submit(e, rid: str, prompt, *, stream: int = 0, **sampling) -> None:
        sampling.setdefault("max_new_tokens", 60)
        r = GenerateRequest(rid=rid, input_ids=prompt, sampling=SamplingParams(**sampling),
                            return_logprob=rid.endswith("lp"))
        s = _Stream(c.clock, stream) if stream else None
        if s is not None:
            streams[rid] = s
        handles[rid] = e.submit(r, on_update=s, on_finish=None)
        if s is not None:
            handles[rid].notify_at = stream

    def pd(rid: str, room: int, n: int) -> None:
        r = GenerateRequest(rid=rid, input_ids=_prompt(room, 200),
                            sampling=SamplingParams(max_new_tokens=n, ignore_eos=True),
                            bootstrap=Bootstrap("127.0.0.1", 9200, room))
        s = _Stream(c.clock, 16)
        streams[rid] = s
        handles[rid + "/d"] = decode.submit(r, on_update=s)
        handles[rid + "/d"].notify_at = 16
        handles[rid + "/p"] = prefill.submit(r)

    for i in range(10):  # more than fit: the queue waits behind max_running, then KV retracts
        rid = f"t{i}" + ("lp" if i == 2 else "")  # log-probabilities of a batch drawn with numpy
        c.call_at(0.01 * i, lambda i=i, rid=rid: submit(tight, rid, _prompt(i, 300), stream=64 * (i % 2),
                                                max_new_tokens=120 + 10 * i, ignore_eos=True))
    for i in range(10):  # the same prompts again: what the cache kept (and evicted) shows
        c.call_at(0.5 + 0.01 * i, lambda i=i: submit(tight, f"again{i}", _prompt(i, 300), max_new_tokens=20,
                                                       ignore_eos=True))
    for i in range(8):
        kw = {"stop_token_ids": [500 + i, 640]} if i % 2 else {"min_new_tokens": 5}
        c.call_at(0.003 * i, lambda i=i, kw=kw: submit(chatty, f"c{i}" + ("lp" if i == 3 else ""),
                                                        _prompt(50 + i, 120), stream=16 if i < 4 else 0,
                                                        max_new_tokens=200, **kw))
    c.call_at(0.05, lambda: pd("pd1", 1, 90))
    c.call_at(0.07, lambda: pd("pd2", 2, 40))
    orphan = GenerateRequest(rid="orphan", input_ids=_prompt(9, 80), sampling=SamplingParams(max_new_tokens=10),
                             bootstrap=Bootstrap("127.0.0.1", 9200, 99))  # its prefill never comes
    c.call_at(0.09, lambda: handles.__setitem__("orphan", decode.submit(orphan)))
    c.call_at(0.137, lambda: tight.abort("t4"))
    c.call_at(0.151, lambda: chatty.update_weight_version("v2", abort_all_requests=False))
    c.call_at(0.2, lambda: tight.pause("in_place"))
    c.call_at(0.23, lambda: tight.continue_generation())
    for k in range(40):
        c.call_at(0.0173 * k, lambda: loads.append([(e.loads(), e.sched.free_tokens(), e.sched.cache.tokens)
                                                    for e in (tight, chatty, decode)]))
    c.run()
    record = {
        "handles": {rid: (h.output_ids, h.output_logprobs, h.finish_reason, h.finish_time, h.first_token_time,
                          h.weight_versions, h.num_retractions, h.cached_tokens) for rid, h in handles.items()},
        "streams": {rid: s.wakes for rid, s in streams.items()},
        "loads": loads,
        "stats": [vars(e.stats) for e in c.engines],
        "retracted": tight.sched.retracted_total,
        "end": c.clock.now(),
    }
    return record, events[0]


def test_stretches_and_iteration_stepping_give_the_same_run() -> None:
    stretched, stretch_events = scenario(True)
    stepped, step_events = scenario(False)
    assert stretched == stepped
    hs = stepped["handles"]
    reasons = {h[2].type for h in hs.values()}
    assert {"stop", "length", "abort"} <= reasons, reasons  # the scenario exercises each ending
    assert stepped["retracted"] > 0 and any(len(w) > 3 for w in stepped["streams"].values())
    assert any(v[0] == "v2" for h in hs.values() for v in h[5])
    assert hs["orphan"][2].message.startswith("Request timed out")
    assert any(hs[f"again{i}"][7] for i in range(10))  # cache hits after KV pressure
    assert stretch_events < 0.75 * step_events, (stretch_events, step_events)


def kv_scenario(stretches: bool) -> tuple[dict, int]:
    """A pool full of cached prefixes under a long decode: each iteration evicts a little of
    the cache until nothing is left to evict and a request is retracted. Snapshots of the
    pool and late requests for the cached prompts see how much was evicted, and when."""
    c = VirtualCluster()
    e = c.add_engine(TINY, EngineConfig(decode_stretches=stretches, max_total_tokens=1400,
                                        max_running_requests=8))
    events = [0]
    process = e._process

    def counted(t: float) -> None:
        events[0] += 1
        process(t)
    e._process = counted
    handles, pool = {}, []

    def submit(rid: str, prompt, n: int) -> None:
        handles[rid] = e.submit(GenerateRequest(rid=rid, input_ids=prompt,
                                                sampling=SamplingParams(max_new_tokens=n, ignore_eos=True)))

    for i in range(4):  # finish at once, leaving their prompts in the cache
        c.call_at(0.001 * i, lambda i=i: submit(f"warm{i}", _prompt(100 + i, 192), 2))
    for i in range(4):
        c.call_at(0.3 + 0.001 * i, lambda i=i: submit(f"long{i}", _prompt(200 + i, 64), 400))
    for k in range(16):  # none after 0.6 s: the last stretch runs into the pool's end alone
        c.call_at(0.3 + 0.0191 * k, lambda: pool.append((e.loads(), e.sched.free_tokens(), e.sched.cache.tokens,
                                                         e.sched.cache.evictable_tokens, e.sched.retracted_total)))
    for i, at in enumerate((0.45, 0.5, 0.55, 1.3)):  # what is left of each cached prompt, and when
        c.call_at(at, lambda i=i: submit(f"probe{i}", _prompt(100 + i, 192), 1))
    c.run()
    record = {"handles": {rid: (h.output_ids, h.finish_time, h.cached_tokens, h.num_retractions)
                          for rid, h in handles.items()},
              "pool": pool, "stats": vars(e.stats), "retracted": e.sched.retracted_total}
    return record, events[0]


def test_stretches_evict_the_cache_as_stepping_does() -> None:
    stretched, stretch_events = kv_scenario(True)
    stepped, step_events = kv_scenario(False)
    assert stretched == stepped
    cached = [tokens for _, _, tokens, _, _ in stepped["pool"]]
    assert cached[0] > min(cached) and len(set(cached)) >= 4  # evicted a little at a time
    assert stepped["retracted"] > 0  # until the pool ran out
    assert stretch_events < 0.6 * step_events, (stretch_events, step_events)


_U64 = st.integers(min_value=0, max_value=MASK)


@given(hashes=st.lists(_U64, min_size=1, max_size=12), salt=_U64, n=st.integers(1, 40),
       vocab=st.sampled_from([7, 300, 151936]), low=st.sampled_from([0, 1, 2]),
       specials=st.sampled_from([(), (1,), (0, 2, 4, 5, 6, 9)]), eos_probability=st.sampled_from([0.0, 0.05, 0.5]),
       rules=st.lists(st.tuples(st.booleans(), st.integers(0, 8), st.integers(0, 12),
                                st.lists(st.integers(-1, 9), max_size=3)), min_size=12, max_size=12))
@settings(max_examples=300, deadline=None)
def test_compiled_draws_equal_one_by_one_draws(hashes, salt, n, vocab, low, specials, eos_probability, rules) -> None:
    """The compiled draw of a batch is ``tokens.draw`` for each request, token for token and
    hash for hash, up to the first request that finishes on a token (EOS or a stop id after
    ``min_new_tokens``), even when tiny vocabularies make EOS, special and stop ids come up
    often."""
    space = TokenSpace(vocab_size=vocab, eos_token_id=min(vocab - 1, 2), low=low, eos_probability=eos_probability,
                       special_ids=frozenset(t for t in specials if t < vocab - 1 and t != 2))
    salts = [(salt * (j + 1)) & MASK for j in range(len(hashes))]
    rules = rules[:len(hashes)]
    params = [SamplingParams(ignore_eos=ignore, min_new_tokens=floor, max_new_tokens=64,
                             stop_token_ids=frozenset(stops))
              for ignore, floor, _, stops in rules]
    k = n + 1
    want_tokens, want_hashes = [], []
    for h, s, sp, (_, _, n_out, _) in zip(hashes, salts, params, rules):
        toks, hs = [], []
        while len(toks) < k - 1:
            tok = draw(space, sp, h, s, n_out)
            h = (h * BASE + tok + 1) & MASK
            toks.append(tok)
            hs.append(h)
            n_out += 1
            if n_out > sp.min_new_tokens and ((not sp.ignore_eos and tok == space.eos_token_id)
                                              or tok in sp.stop_token_ids):
                k = len(toks)
                break
        want_tokens.append(toks)
        want_hashes.append(hs)
    got_tokens, got_hashes, got_k = draw_runs(space, hashes, salts, [n_out for _, _, n_out, _ in rules],
                                              [not sp.ignore_eos for sp in params],
                                              [sp.min_new_tokens for sp in params],
                                              [sp.stop_token_ids for sp in params], n)
    assert got_k == k
    assert got_tokens == [t[:k - 1] for t in want_tokens]
    assert got_hashes == [hs[:k - 1] for hs in want_hashes]
