"""The model runner over the state pool against the reference forward (``tests/runtime/reference.py``):
chunked prefill equals one-pass prefill, batched decode equals each sequence decoded alone."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner

from .conftest import make_model, rand_tokens
from .reference import decode_step, prefill


def _runner(arch: str, slots: int = 4, kv_tokens: int = 512, page_size: int = 8):
    model, _, _ = make_model(arch)
    p = next(model.parameters())
    pool = StatePool(
        model.config, slots=slots, kv_tokens=kv_tokens, page_size=page_size, device=p.device, dtype=p.dtype
    )
    return model, pool, ModelRunner(model, pool)


@pytest.mark.parametrize("arch", ["qwen3_5_text", "llama", "falcon_h1"])
def test_chunked_prefill_equals_one_pass(arch):
    model, pool, runner = _runner(arch)
    toks = rand_tokens(45, 1)
    ref = prefill(model, [toks])[0]
    seq = pool.alloc(60)
    assert seq is not None
    for a, b in ((0, 7), (7, 30), (30, 45)):  # chunks crossing page boundaries (page_size 8)
        logits = runner.forward(plan_forward(pool, [seq], [toks[a:b]]))
    assert seq.length == 45 and seq.tokens == toks
    torch.testing.assert_close(logits[0], ref.last_logits, rtol=1e-4, atol=1e-4)
    out = pool.export(seq)
    for mine, theirs in zip(out.layers, ref.layers, strict=True):
        for x, y in zip(vars(mine).values(), vars(theirs).values(), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("paged", [False, True])  # True: decode attends through the block table (twin on CPU)
@pytest.mark.parametrize("arch", ["qwen3_5_text", "llama", "falcon_h1"])
def test_batched_decode_equals_each_alone(arch, paged):
    model, pool, runner = _runner(arch)
    prompts = [rand_tokens(n, 10 + n) for n in (5, 17, 9)]
    seqs = [pool.alloc(40) for _ in prompts]
    assert all(s is not None for s in seqs)
    # prefill the three prompts in one mixed forward, then decode 6 steps together
    logits = runner.forward(plan_forward(pool, seqs, prompts))
    steps = [rand_tokens(3, 100 + i) for i in range(6)]
    batched = [logits]
    for step in steps:
        plan = plan_forward(pool, seqs, [[t] for t in step], paged=paged)
        assert (plan.key_rows.numel() == 0) == paged
        batched.append(runner.forward(plan))
    for i, p in enumerate(prompts):
        alone = prefill(model, [p])[0]
        torch.testing.assert_close(batched[0][i], alone.last_logits, rtol=1e-4, atol=1e-4)
        for k, step in enumerate(steps):
            decode_step(model, [alone], [step[i]])
            torch.testing.assert_close(batched[k + 1][i], alone.last_logits, rtol=1e-4, atol=1e-4)


def test_pool_alloc_free_and_load_roundtrip():
    model, pool, _ = _runner("qwen3_5_text", slots=2, kv_tokens=32, page_size=8)
    a, b = pool.alloc(16), pool.alloc(16)
    assert a is not None and b is not None and pool.alloc(1) is None  # no slot left
    assert pool.usage().pages_used == 4 and pool.usage().slots_used == 2
    state = prefill(model, [rand_tokens(13, 5)])[0]
    pool.load(a, state)
    back = pool.export(a)
    assert back.length == 13
    for mine, theirs in zip(back.layers, state.layers, strict=True):
        for x, y in zip(vars(mine).values(), vars(theirs).values(), strict=True):
            assert torch.equal(x, y.to(x.dtype))
    pool.free(a)
    pool.free(b)
    assert pool.usage().pages_used == 0 and pool.usage().slots_used == 0
    assert not pool.fits_ever(33) and pool.fits_ever(32)


@pytest.mark.parametrize("arch", ["qwen3_5_text", "llama", "falcon_h1", "kimi_linear"])
def test_a_paged_step_mixing_decode_rows_and_a_chunk_equals_the_gathered_step(arch):
    """A paged plan with one-token rows beside a prefill chunk (``plan.PagedRows``): the decode rows
    attend through the block table (the twin on CPU), only the chunk's sequence gathers its keys; the
    logits and every state equal the same step with every row gathering its keys, then a decode-only
    step after it too."""
    model, _, _ = make_model(arch)
    p = next(model.parameters())
    pools = [StatePool(model.config, slots=4, kv_tokens=512, page_size=8, device=p.device, dtype=p.dtype) for _ in "ab"]
    runners = [ModelRunner(model, pool) for pool in pools]
    prompts = [rand_tokens(n, 30 + n) for n in (13, 21, 9)]
    seqs = [[pool.alloc(64) for _ in prompts] for pool in pools]
    for runner, ss in zip(runners, seqs, strict=True):
        runner.forward(plan_forward(runner.pool, ss, prompts))
    step = [rand_tokens(1, 7), rand_tokens(6, 8), rand_tokens(1, 9)]  # decode, a 6-token chunk, decode
    paged = plan_forward(pools[0], seqs[0], step, paged=True)
    gathered = plan_forward(pools[1], seqs[1], step)
    assert paged.paged_rows is not None and gathered.paged_rows is None
    assert paged.paged_rows.decode_tok.tolist() == [0, 7] and paged.paged_rows.extend_tok.tolist() == list(range(1, 7))
    assert paged.key_rows.numel() == 21 + 6  # only the chunk's sequence gathers its keys
    assert gathered.key_rows.numel() == (13 + 1) + (21 + 6) + (9 + 1)
    a, b = runners[0].forward(paged), runners[1].forward(gathered)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for name in ("recurrent", "conv", "k", "v"):
        torch.testing.assert_close(getattr(pools[0], name), getattr(pools[1], name), rtol=1e-4, atol=1e-4)
    nxt = [[t] for t in rand_tokens(3, 11)]
    a = runners[0].forward(plan_forward(pools[0], seqs[0], nxt, paged=True))
    b = runners[1].forward(plan_forward(pools[1], seqs[1], nxt))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
