"""The radix prefix cache over the state pool's pages (``runner/radix_cache.py``): pages are shared by
reference and refcounted, a prefix resumes from its linear-state snapshot, LRU eviction frees the
least recently used unlocked prefix and never one in use; through the scheduler a hit gives the
tokens and logprobs of a full recompute (a boundary inside a page, a partial match), and requests
writing after a shared boundary never change the cached rows."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.results import FinishEvent, TokenEvent
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.radix_cache import RadixCache
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.scheduler.work import prefix_keys
from hypic_agent.runtime.serving import Serving

from .conftest import Plan, Seg, make_model, rand_tokens

PS = 8  # page size everywhere here


@pytest.fixture(scope="module")
def model():
    return make_model("qwen3_5_text")[0]


def _pool(model, kv_tokens: int = 256, snapshots: int = 4, slots: int = 4) -> StatePool:
    return StatePool(
        model.config,
        slots=slots,
        kv_tokens=kv_tokens,
        page_size=PS,
        device=torch.device("cpu"),
        dtype=torch.float32,
        snapshots=snapshots,
    )


def _fill(pool: StatePool, seq, length: int, seed: int) -> None:
    """Give ``seq`` a recognisable state of ``length`` tokens: random KV rows and linear state."""
    g = torch.Generator().manual_seed(seed)
    for t in (pool.k, pool.v):
        flat = t.view(t.shape[0], -1, *t.shape[3:])
        rows = pool.rows(seq, 0, length)
        flat[:, rows] = torch.randn(flat[:, rows].shape, generator=g)
    pool.recurrent[:, seq.slot] = torch.randn(pool.recurrent[:, seq.slot].shape, generator=g)
    pool.conv[:, seq.slot] = torch.randn(pool.conv[:, seq.slot].shape, generator=g)
    seq.length = length


# ---------------------------------------------------------------------------------------- pool + tree
def test_insert_shares_the_pages_and_a_hit_resumes_from_them(model):
    pool = _pool(model)
    cache = RadixCache(pool)
    a = pool.alloc(40)  # 5 pages
    assert a is not None
    _fill(pool, a, 19, seed=1)  # segments of 5 + 14 tokens: the boundary is inside page 2 (19 = 2 * 8 + 3)
    rec, conv = pool.recurrent[:, a.slot].clone(), pool.conv[:, a.slot].clone()
    end = cache.insert(["s1", "s2"], [5, 14], a)
    assert end is not None and end.locks == 1 and pool.usage().snapshots_used == 1
    assert [n.pages for n in end.path()] == [a.pages[:1], a.pages[:3]]  # a's own page ids, none copied
    assert [pool.refs(p) for p in a.pages] == [3, 2, 2, 1, 1]  # page 0 is in both nodes
    used = pool.usage().pages_used
    pool.free(a)
    cache.unlock(end)
    assert pool.usage().pages_used == used - 2  # the 3 cached pages stay, the 2 past the boundary go
    pool.recurrent[:, a.slot] = 0.0  # the slot is reused: the snapshot is a copy

    assert cache.match(["s1"]) is None  # no linear state was kept after s1 alone
    assert cache.match(["x", "s1", "s2"]) is None
    hit = cache.match(["s1", "s2", "s3"])
    assert hit is not None and (hit.depth, hit.tokens) == (2, 19) and hit.node is end and end.locks == 1
    assert hit.pages == tuple(a_pages := end.pages[:3]) and hit.shared == tuple(a_pages[:2])
    assert hit.partial == a_pages[2]
    b = pool.alloc(40, shared=hit.shared)
    assert b is not None and b.pages[:2] == a_pages[:2] and b.pages[2] not in a_pages
    cache.restore(hit, b)
    assert b.length == 19
    assert torch.equal(pool.recurrent[:, b.slot], rec) and torch.equal(pool.conv[:, b.slot], conv)
    assert torch.equal(pool.k[:, b.pages[2]], pool.k[:, a_pages[2]])  # the partial page: copied
    pool.k[:, b.pages[2], 3:] = 7.0  # b writes its next positions into its own page
    assert not (pool.k[:, a_pages[2]] == 7.0).any()
    assert [pool.refs(p) for p in a_pages] == [3, 2, 1]
    pool.free(b)
    cache.unlock(hit.node)
    assert [pool.refs(p) for p in a_pages] == [2, 1, 1]  # freeing the request keeps the cached pages
    assert cache.clear() == 3 and pool.usage().pages_used == 0 and pool.usage().snapshots_used == 0
    assert cache.stats().nodes == 0 and cache.stats().pages == 0


def _cached(pool: StatePool, cache: RadixCache, key: str, seed: int) -> list[int]:
    """A request of one 12-token segment ``key`` that inserted itself and finished; its cached pages."""
    seq = pool.alloc(20)
    assert seq is not None
    _fill(pool, seq, 12, seed)
    node = cache.insert([key], [12], seq)
    assert node is not None
    pool.free(seq)
    cache.unlock(node)
    return node.pages


def test_lru_eviction_frees_the_least_recently_used_unlocked_prefix(model):
    pool = _pool(model, kv_tokens=64, snapshots=8)  # 8 pages
    cache = RadixCache(pool)
    pages = {k: _cached(pool, cache, k, seed=i) for i, k in enumerate("abc")}  # 2 pages each
    assert pool.free_pages == 2
    used = cache.match(["a"])  # "a" is used again: "b" is now the least recently used
    assert used is not None
    cache.unlock(used.node)
    held = cache.match(["c"])  # "c" is in use (locked) by a running request
    assert held is not None
    assert cache.evict(1) == 2  # a whole prefix goes: b's two pages
    assert cache.match(["b"]) is None and pool.free_pages == 4
    assert all(pool.refs(p) == 0 for p in pages["b"]) and all(pool.refs(p) == 1 for p in pages["a"])
    assert cache.evict(100) == 2  # only "a" can go: "c" is locked
    assert cache.match(["a"]) is None and pool.free_pages == 6
    again = cache.match(["c"])
    assert again is not None and again.pages == tuple(pages["c"])
    cache.unlock(again.node)
    cache.unlock(held.node)
    assert cache.evict(1) == 2 and pool.free_pages == 8 and cache.stats().evicted_nodes == 3


def test_snapshot_rows_run_out_the_lru_unlocked_prefix_gives_its_row(model):
    pool = _pool(model, kv_tokens=256, snapshots=2)
    cache = RadixCache(pool)
    _cached(pool, cache, "a", 1)
    _cached(pool, cache, "b", 2)
    _cached(pool, cache, "c", 3)  # no free row: "a" (least recently used) is evicted, pages too
    assert cache.match(["a"]) is None and cache.stats().snapshots == 2 and cache.stats().pages == 4
    hb, hc = cache.match(["b"]), cache.match(["c"])  # both in use: no row can be taken
    assert hb is not None and hc is not None
    seq = pool.alloc(20)
    assert seq is not None
    _fill(pool, seq, 12, 4)
    assert cache.insert(["d"], [12], seq) is None  # nothing kept, no page referenced by the tree
    assert [pool.refs(p) for p in seq.pages] == [1, 1, 1] and cache.stats().nodes == 2
    pool.free(seq)
    cache.unlock(hb.node)
    cache.unlock(hc.node)


def test_a_prefix_of_a_cached_path_gets_its_own_snapshot_and_both_resume(model):
    pool = _pool(model)
    cache = RadixCache(pool)
    long_seq = pool.alloc(40)
    assert long_seq is not None
    _fill(pool, long_seq, 30, 5)
    deep = cache.insert(["s1", "s2"], [10, 20], long_seq)
    assert deep is not None
    short = pool.alloc(40)
    assert short is not None
    _fill(pool, short, 10, 6)
    mid = cache.insert(["s1"], [10], short)  # the s1 node exists (long_seq's pages): it gains a snapshot
    assert mid is not None and mid is deep.parent and mid.pages == long_seq.pages[:2]
    h1, h2 = cache.match(["s1", "zz"]), cache.match(["s1", "s2", "zz"])
    assert h1 is not None and h2 is not None and (h1.tokens, h2.tokens) == (10, 30)
    assert h2.pages == tuple(long_seq.pages[:4])
    for n in (h1.node, h2.node, mid, deep):
        cache.unlock(n)
    pool.free(long_seq)
    pool.free(short)
    assert cache.clear() == 4 and pool.usage().pages_used == 0


# ---------------------------------------------------------------------------------------- scheduler
BASE = dict(min_cached_tokens=4, kv_page_size=PS, prefill_chunk_tokens=32, max_running=8, kv_pool_tokens=2048)


def _serve(model, **kw) -> Serving:
    return Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", Settings(**(BASE | kw))))


def _final(events) -> FinishEvent:
    evs = list(events)
    assert isinstance(evs[-1], FinishEvent) and all(isinstance(e, TokenEvent) for e in evs[:-1])
    return evs[-1]


def _same(a: FinishEvent, b: FinishEvent) -> None:
    """Greedy tokens equal; the logprobs of the chosen and of the 5 most likely tokens within 1e-4."""
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    for x, y in zip(a.top_logprobs, b.top_logprobs, strict=True):
        assert [t for t, _ in x] == [t for t, _ in y]
        assert [v for _, v in x] == pytest.approx([v for _, v in y], abs=1e-4)


def _seg(n: int, seed: int) -> Seg:
    return Seg(tuple(rand_tokens(n, seed)))


S1, S2, S3, S4 = _seg(13, 9001), _seg(21, 9002), _seg(14, 9003), _seg(11, 9004)  # 13 + 21 = 34: inside a page


def _sampling(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, logprobs=True, top_logprobs=5)


def test_hits_equal_full_recompute_boundary_inside_a_page_and_partial_match(model):
    ref = _serve(model)
    serving = _serve(model)
    plans = [
        (Plan([S1, S2], rand_tokens(5, 1)), 0),  # cold: caches s1+s2 (34 tokens: 4 pages + 2 rows)
        (Plan([S1, S2], rand_tokens(7, 2)), 34),  # both segments hit, another question
        (Plan([S1, S2, S3], rand_tokens(5, 3)), 34),  # only the first two segments match
        (Plan([S1, S2, S3], rand_tokens(6, 4)), 48),  # now all three (a page-aligned boundary: 48)
        (Plan([S1, S4], rand_tokens(5, 5)), 0),  # s1 alone has no linear state kept: a miss
        (Plan([S1, S4, S2], rand_tokens(5, 6)), 24),  # s1+s4 was just cached
    ]
    for plan, reused in plans:
        want = _final(ref.generate(plan, _sampling(6), mode="full_recompute"))
        got = _final(serving.generate(plan, _sampling(6), mode="prefix_cache"))
        _same(got, want)
        assert got.prepared.exact_prefix_tokens == reused and got.prepared.cached_tokens == reused
    st = serving.scheduler.radix.stats()
    assert st.hits == 4 and st.hit_tokens == 34 + 34 + 48 + 24 and st.snapshots == 4  # 4 distinct boundaries
    ref.close()
    serving.close()


def _first_token(it) -> None:
    assert isinstance(next(it), TokenEvent)


@contextlib.contextmanager
def _paused(sched):
    """No scheduler step runs inside (the engine thread is stopped, then started again): a check of
    live requests cannot race with their decoding (waiting for the engine's lock instead could let
    the thread run many steps first on a loaded machine)."""
    sched.shutdown()
    try:
        yield
    finally:
        sched.start()


def test_requests_sharing_a_boundary_page_neither_corrupt_it_nor_each_other(model):
    ref = _serve(model)
    serving = _serve(model)
    sched, pool = serving.scheduler, serving.pool
    a_plan = Plan([S1, S2], rand_tokens(5, 11))
    others = [Plan([S1, S2], rand_tokens(5 + i, 12 + i)) for i in range(2)]
    want_a = _final(ref.generate(a_plan, _sampling(60), mode="full_recompute"))
    want = [_final(ref.generate(p, _sampling(12), mode="full_recompute")) for p in others]

    ha = sched.submit(GenerationRequest(a_plan, _sampling(60), "prefix_cache"))
    it_a = ha.events(timeout=120)
    events_a = [next(it_a)]  # a decodes: its boundary (34 tokens, inside page 4) is in the cache
    assert isinstance(events_a[0], TokenEvent)
    sched.shutdown()  # no step runs now; the first submit below starts the thread, which waits for the lock
    with serving.engine.lock:  # nothing steps: both are admitted together, both hit
        keys = prefix_keys(serving.engine, sched.engine.pieces(a_plan, mode="prefix_cache"), "default")
        hit = sched.radix.match(keys)
        assert hit is not None and hit.tokens == 34 and hit.partial is not None
        sched.radix.unlock(hit.node)
        full = list(hit.shared)
        base = [pool.refs(p) for p in full]  # a's block table and the tree's nodes (a straddling page: two)
        cached_k = pool.k[:, list(hit.pages)].clone()
        cached_v = pool.v[:, list(hit.pages)].clone()
        hs = [sched.submit(GenerationRequest(p, _sampling(12), "prefix_cache")) for p in others]
    its = [h.events(timeout=120) for h in hs]
    firsts = [next(it) for it in its]
    with _paused(sched):  # three live requests over the same cached pages
        live = {id(r.handle): r for r in sched.live}
        seqs = [live[id(h)].seq for h in (ha, *hs)]
        assert all(s is not None for s in seqs)
        assert all(s.pages[:4] == full for s in seqs)  # the same physical pages, not copies
        assert [pool.refs(p) for p in full] == [b + 2 for b in base]  # and the two hits' references
        own = [s.pages[4] for s in seqs]  # the page holding the boundary: a's is cached, the hits copied it
        assert own[0] == hit.partial and len(set(own)) == 3
    got = [_final([f, *it]) for f, it in zip(firsts, its, strict=True)]
    for g, w in zip(got, want, strict=True):
        _same(g, w)
        assert g.prepared.exact_prefix_tokens == 34
    assert [pool.refs(p) for p in full] == base  # the hits are freed: a and the tree keep the pages
    got_a = _final([*events_a, *it_a])
    _same(got_a, want_a)
    assert [pool.refs(p) for p in full] == [b - 1 for b in base] and min(base) >= 2  # a freed: the tree's alone
    # everybody wrote past the boundary (a into the cached page itself): the cached rows are unchanged
    rows = 34 - 4 * PS
    assert torch.equal(pool.k[:, full], cached_k[:, :4]) and torch.equal(pool.v[:, full], cached_v[:, :4])
    assert torch.equal(pool.k[:, hit.partial, :rows], cached_k[:, 4, :rows])
    assert torch.equal(pool.v[:, hit.partial, :rows], cached_v[:, 4, :rows])
    assert bool((pool.k[:, hit.partial, rows:] != 0).flatten(2).any(-1).all())  # a wrote its later rows there
    ref.close()
    serving.close()


def _in_tree(cache: RadixCache, keys: list[str]) -> bool:
    """Whether the path ``keys`` ends at a node with a snapshot (read without touching LRU times)."""
    node = cache.root
    for k in keys:
        if (child := node.children.get(k)) is None:
            return False
        node = child
    return node.snapshot is not None


def test_pool_pressure_evicts_lru_prefixes_never_one_in_use(model):
    # 64 pages: a long request holds 30 and its cached prefix; the others cycle through the rest
    ref = _serve(model)
    serving = _serve(model, kv_pool_tokens=64 * PS, max_running=2)
    sched = serving.scheduler
    a_plan = Plan([S1, S2], rand_tokens(5, 21))
    plans = [Plan([_seg(13, 9100 + i), _seg(21, 9200 + i)], rand_tokens(5, 22 + i)) for i in range(10)]
    want = [_final(ref.generate(p, _sampling(6), mode="full_recompute")) for p in plans]
    ha = sched.submit(GenerationRequest(a_plan, SamplingParams(max_tokens=200, ignore_eos=True), "prefix_cache"))
    it_a = ha.events(timeout=120)
    _first_token(it_a)
    a_keys = prefix_keys(serving.engine, serving.engine.pieces(a_plan, mode="prefix_cache"), "default")
    a_present = []
    for p, w in zip(plans, want, strict=True):
        got = _final(sched.submit(GenerationRequest(p, _sampling(6), "prefix_cache")).events(timeout=120))
        _same(got, w)
        with _paused(sched):
            a_present.append((any(r.handle is ha for r in sched.live), _in_tree(sched.radix, a_keys)))
    assert all(present for live, present in a_present if live)  # a's prefix (the oldest) stayed while a ran
    assert a_present[-1][0]  # a was still running at the end: the test saw evictions under its lock
    st = sched.radix.stats()
    assert st.evicted_nodes >= 8  # 5 pages per cached prefix: most of the ten were evicted
    with serving.engine.lock:
        keys = [prefix_keys(serving.engine, serving.engine.pieces(p, mode="prefix_cache"), "default") for p in plans]
        present = [_in_tree(sched.radix, k) for k in keys]
    assert present[-1] and not present[0]  # the newest stays, the oldest went first
    assert present == sorted(present)  # LRU: the evicted are the earliest
    list(it_a)
    ref.close()
    serving.close()


def test_the_boundary_costs_no_forward_of_its_own_and_without_a_free_row_it_stops_there(model):
    # chunks of 64 hold a whole prompt: a cold prefix_cache request runs its prompt in ONE forward (the
    # boundary snapshotted inside it), as full_recompute does
    ref = _serve(model, prefill_chunk_tokens=64)
    serving = _serve(model, prefill_chunk_tokens=64, prefix_snapshots=1)
    sched = serving.scheduler
    plan = Plan([S1, S2], rand_tokens(5, 31))
    want = _final(ref.generate(plan, _sampling(4), mode="full_recompute"))
    before = sched.stats.forwards
    got = _final(sched.submit(GenerationRequest(plan, _sampling(4), "prefix_cache")).events(timeout=120))
    _same(got, want)
    assert sched.stats.forwards - before == 4  # the prompt's forward, then 3 decode steps
    assert sched.radix.stats().snapshots == 1
    hit = _final(
        sched.submit(GenerationRequest(Plan([S1, S2], rand_tokens(6, 32)), _sampling(4), "prefix_cache")).events(
            timeout=120
        )
    )
    _same(hit, _final(ref.generate(Plan([S1, S2], rand_tokens(6, 32)), _sampling(4), mode="full_recompute")))
    assert hit.prepared.exact_prefix_tokens == 34  # the snapshot taken inside the forward resumes exactly

    # the one snapshot row is held by a running request's prefix: another cold request finds no row,
    # stops its chunk at its boundary (one forward more), keeps nothing, and is still exact
    ha = sched.submit(
        GenerationRequest(
            Plan([S1, S2], rand_tokens(5, 33)), SamplingParams(max_tokens=300, ignore_eos=True), "prefix_cache"
        )
    )
    it_a = ha.events(timeout=120)
    _first_token(it_a)
    other = Plan([S3, S4], rand_tokens(5, 34))
    want_o = _final(ref.generate(other, _sampling(4), mode="full_recompute"))
    got_o = _final(sched.submit(GenerationRequest(other, _sampling(4), "prefix_cache")).events(timeout=120))
    _same(got_o, want_o)
    assert sched.radix.stats().snapshots == 1 and sched.pool.usage().snapshots_used == 1  # no row leaked
    ha.cancel()
    list(it_a)
    ref.close()
    serving.close()
