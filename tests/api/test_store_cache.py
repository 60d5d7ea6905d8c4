"""StoreEntryCache: the engine's entries in the persistent tiered store (restart -> disk tier)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.hypic.entry import LinearEntry
from hypic_agent.runtime.hypic.store_cache import EntryHint, StoreEntryCache
from hypic_agent.segments.store.segment_store import SegmentStore

TOKENS = [list(range(10, 60)), list(range(100, 140))]


def open_store(tmp_path) -> SegmentStore:
    return SegmentStore.from_settings(Settings(home=tmp_path, device="cpu"))


@pytest.fixture
def cache_over(engine):
    made: list[SegmentStore] = []
    old = engine.cache

    def make(tmp_path, fingerprint=None):
        store = open_store(tmp_path)
        made.append(store)
        cache = StoreEntryCache(store, engine.model.config.layer_types, fingerprint or engine.fingerprint)
        engine.cache = cache
        return cache

    yield make
    engine.cache = old
    for s in made:
        s.close()


def test_roundtrip_and_restart_hits_disk_then_cpu(engine, tmp_path, cache_over):
    cache = cache_over(tmp_path)
    key = engine.entry_key(TOKENS[0], "t1", 8)
    with cache.described({key: EntryHint(text="doc text", title="T", pinned=True)}):
        usage = engine.prewarm(TOKENS, ["document", "memory"], tenant="t1")
    assert [u.hit for u in usage] == [False, False] and cache.inserts[key] == 1
    hit = cache.lookup(key)
    assert hit.tier == "cpu" and hit.entry is not None and hit.entry.token_ids == tuple(TOKENS[0])
    rec = cache.store.info(key, "t1")
    assert rec.text == "doc text" and rec.title == "T" and rec.pinned and rec.token_ids == tuple(TOKENS[0])
    assert cache.pending_hints() == 0
    cache.store.close()

    cache2 = cache_over(tmp_path)  # "restart": a new store over the same files + registry
    cold = cache2.lookup(key)
    assert cold.tier == "disk"
    for a, b in zip(hit.entry.layers, cold.entry.layers, strict=True):
        pairs = [(a.T, b.T), (a.S, b.S)] if isinstance(a, LinearEntry) else [(a.k, b.k), (a.v, b.v)]
        for x, y in pairs:
            assert torch.equal(x, y)
    assert cache2.lookup(key).tier == "cpu"  # promoted on hit
    usage = engine.prewarm(TOKENS, ["document", "memory"], tenant="t1")
    assert all(u.hit for u in usage) and not cache2.inserts  # nothing recomputed


def test_foreign_fingerprint_is_a_miss_and_dropped(engine, tmp_path, cache_over):
    cache = cache_over(tmp_path)
    engine.prewarm(TOKENS[:1], ["document"], tenant="t1")
    key = engine.entry_key(TOKENS[0], "t1", 8)
    cache.store.close()
    other = cache_over(tmp_path, fingerprint="some-other-model:fp32:0")
    assert other.lookup(key).entry is None
    assert not other.store.contains(key)  # never served, removed


def test_tenants_never_share_keys(engine):
    assert engine.entry_key(TOKENS[0], "a", 8) != engine.entry_key(TOKENS[0], "b", 8)


def test_an_entry_that_does_not_decode_loses_its_payload_not_its_row(engine, tmp_path, cache_over):
    cache = cache_over(tmp_path)
    engine.prewarm(TOKENS[:1], ["document"], tenant="t1")
    key = engine.entry_key(TOKENS[0], "t1", 8)
    kinds = engine.model.config.layer_types
    wrong = StoreEntryCache(cache.store, (*kinds, kinds[0]), engine.fingerprint)  # one layer more
    assert wrong.lookup(key).entry is None
    rec = cache.store.info(key, "t1")
    assert rec is not None and rec.token_ids == tuple(TOKENS[0])  # the id survives, rebuildable
    assert not cache.store.contains(key)  # the payload is gone
    usage = engine.prewarm(TOKENS[:1], ["document"], tenant="t1")
    assert not usage[0].hit and cache.lookup(key).entry is not None  # rebuilt on use
