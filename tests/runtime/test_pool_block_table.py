"""The state pool's block table per slot (``StatePool.block_table``) and the decode plans that gather it:
each allocated slot's row is its sequence's pages then zeros, through allocs, frees, slot reuse, pages
shared with other requests and the prefix cache, and a sequence longer than the table's width; a paged
decode plan's table is each sequence's pages cut to the widest, and decoding through it (after a slot was
reused by a shorter sequence) gives the logits of the plain gather path."""

from __future__ import annotations

import random

import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import PoolSeq, StatePool
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler.request import GenerationRequest
from hypic_agent.runtime.serving import Serving

from .conftest import Plan, Seg, make_model, rand_tokens

CPU = torch.device("cpu")


def _pool(slots: int = 6, kv_tokens: int = 160, page_size: int = 4, max_seq_tokens: int | None = 48) -> StatePool:
    model, _, _ = make_model("qwen3_5_text")
    return StatePool(
        model.config,
        slots=slots,
        kv_tokens=kv_tokens,
        page_size=page_size,
        device=CPU,
        dtype=torch.float32,
        max_seq_tokens=max_seq_tokens,
    )


def _row(pool: StatePool, pages: list[int]) -> list[int]:
    return pages + [0] * (pool.block_table.shape[1] - len(pages))


def _check(pool: StatePool, live: list[PoolSeq]) -> None:
    assert pool.block_table[0].tolist() == [0] * pool.block_table.shape[1]  # scratch slot: padding rows
    for s in live:
        assert pool.block_table[s.slot].tolist() == _row(pool, s.pages)


def test_each_slots_row_is_its_pages_through_allocs_frees_reuse_and_shared_pages():
    pool = _pool()
    rng = random.Random(0)
    live: list[PoolSeq] = []
    for _ in range(300):
        if live and (rng.random() < 0.45 or not pool.free_slots):
            pool.free(live.pop(rng.randrange(len(live))))
        else:
            tokens = rng.randint(1, 48)
            shared: list[int] = []
            donors = [s for s in live if len(s.pages) > 1]
            if donors and rng.random() < 0.5:  # begin with another request's pages, as a prefix-cache hit does
                donor = rng.choice(donors)
                shared = donor.pages[: rng.randint(1, min(len(donor.pages), pool.pages_for(tokens)))]
            seq = pool.alloc(tokens, shared)
            if seq is not None:
                assert seq.pages[: len(shared)] == shared
                live.append(seq)
        _check(pool, live)
    assert {s.slot for s in live} == {s.slot for s in live if pool.block_table[s.slot].any()}


def test_a_sequence_longer_than_the_table_widens_it_keeping_every_row():
    pool = _pool(kv_tokens=160, max_seq_tokens=16)  # 4 columns
    a = pool.alloc(14)
    assert a is not None and pool.block_table.shape[1] == 4
    b = pool.alloc(40)  # 10 pages
    assert b is not None and pool.block_table.shape[1] == 10
    _check(pool, [a, b])
    plan = plan_forward(pool, [a, b], [[1], [2]], paged=True)
    assert plan.block_table.tolist() == [_row(pool, a.pages)[:10], b.pages]


def test_a_paged_decode_plan_holds_each_sequences_pages_and_rows():
    pool = _pool(page_size=4)
    seqs = [pool.alloc(n) for n in (9, 30, 3)]
    assert all(s is not None for s in seqs)
    for s, n in zip(seqs, (5, 17, 0), strict=True):
        s.length = n  # type: ignore[union-attr]
    plan = plan_forward(pool, seqs, [[7], [8], [9]], paged=True)  # type: ignore[arg-type]
    width = max(len(s.pages) for s in seqs)  # type: ignore[union-attr]
    assert plan.block_table.dtype == torch.int32
    assert plan.block_table.tolist() == [_row(pool, s.pages)[:width] for s in seqs]  # type: ignore[union-attr]
    assert plan.ids.tolist() == [7, 8, 9]
    assert plan.positions.tolist() == [5, 17, 0]
    assert plan.slots.tolist() == [s.slot for s in seqs]  # type: ignore[union-attr]
    assert plan.rows.tolist() == [s.pages[n // 4] * 4 + n % 4 for s, n in zip(seqs, (5, 17, 0), strict=True)]  # type: ignore[union-attr]
    assert plan.context_lens.tolist() == [6, 18, 1]
    assert plan.cu_seqlens.tolist() == plan.cu_host.tolist() == [0, 1, 2, 3]
    assert plan.last_rows.tolist() == [0, 1, 2]
    assert plan.key_rows.numel() == 0 and plan.decode_only


def _decode_after_slot_reuse(paged: bool) -> list[torch.Tensor]:
    model, _, _ = make_model("qwen3_5_text")
    pool = StatePool(model.config, slots=3, kv_tokens=512, page_size=4, device=CPU, dtype=torch.float32)
    runner = ModelRunner(model, pool)
    long_seq = pool.alloc(60)
    assert long_seq is not None
    runner.forward(plan_forward(pool, [long_seq], [rand_tokens(50, 1)]))
    pool.free(long_seq)  # its slot's row held 15 pages
    seqs = [pool.alloc(20), pool.alloc(40)]  # table width 10: the reused row is cut wider than its pages
    assert seqs[0] is not None and seqs[1] is not None
    assert seqs[0].slot == 1 and len(seqs[0].pages) == 5  # the long sequence's slot, now shorter
    out = [runner.forward(plan_forward(pool, seqs, [rand_tokens(n, 10 + n) for n in (6, 13)]))]  # type: ignore[arg-type]
    for step in range(3):
        plan = plan_forward(pool, seqs, [[t] for t in rand_tokens(2, 100 + step)], paged=paged)  # type: ignore[arg-type]
        assert (plan.key_rows.numel() == 0) == paged
        out.append(runner.forward(plan).clone())
    return out


def test_paged_decode_after_a_slot_is_reused_by_a_shorter_sequence_equals_the_gather_path():
    for got, want in zip(_decode_after_slot_reuse(True), _decode_after_slot_reuse(False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_scheduler_prefix_cache_requests_keep_their_rows_while_decoding():
    """prefix_cache requests (shared pages of cached prefixes, copy-on-write boundary pages) and plain
    ones admitted and retired in turn: at every step each running request's row is its pages."""
    model, _, _ = make_model("qwen3_5_text")
    settings = Settings(
        min_cached_tokens=4, kv_page_size=8, prefill_chunk_tokens=32, max_running=3, kv_pool_tokens=1024
    )
    serving = Serving.of(Engine(model, tiny_tokenizer(), "tiny-test", settings))
    sched = serving.scheduler
    sched.start = lambda: None  # type: ignore[method-assign]  # steps driven here
    docs = [Seg(tuple(rand_tokens(21, 500 + i))) for i in range(3)]
    handles = []
    for i in range(8):
        plan = Plan([docs[i % 3], docs[(i + 1) % 3]], rand_tokens(3, 900 + i))
        sampling = SamplingParams(max_tokens=3 + i % 4, ignore_eos=True)
        handles.append(sched.submit(GenerationRequest(plan, sampling, "prefix_cache" if i % 4 else "full_recompute")))
    steps = 0
    while sched.live or sched._waiting or not sched._inbox.empty() or sched._inflight is not None:
        sched.step()
        steps += 1
        _check(serving.pool, [r.seq for r in sched.live if r.seq is not None])
        assert steps < 500
    assert all(len(list(h.events(timeout=1))) > 0 for h in handles)
    assert sched.stats.finished == 8 and sched.radix.stats().nodes > 0
    serving.close()
