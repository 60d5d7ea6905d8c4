"""GPU: the paged decode-attention Triton kernel against its torch twin at the Qwen3.5-35B-A3B
attention shape (Hq 16, Hkv 2, D = Dv = 256, bf16), and inside a CUDA graph whose block table,
context lengths and query change between replays."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.paged_attention import paged_decode_attention, paged_decode_attention_torch
from tests.kernels.helpers import rel_err
from tests.kernels.test_paged_attention import paged_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

HQ, HKV, D = 16, 2, 256
SCALE = D**-0.5


def _check(out: torch.Tensor, ref: torch.Tensor, lens: list[int], tol: float, what: object) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype and not out.isnan().any(), what
    for i, L in enumerate(lens):
        if L == 0:
            assert torch.equal(out[i], torch.zeros_like(out[i])), (what, i)
        else:
            err = rel_err(out[i].float(), ref[i].float())
            assert err < tol, (what, i, L, err)


@pytest.mark.parametrize("page_size", [16, 64])
def test_bf16_matches_twin(page_size):
    lens = [1, 100, 2049, 20000, 0]
    x, _, _ = paged_inputs(lens, HQ, HKV, D, D, page_size, seed=page_size, dtype=torch.bfloat16, device="cuda")
    ref = paged_decode_attention_torch(**x, scale=SCALE)
    for ns in (None, 1, 7):
        out = paged_decode_attention(**x, scale=SCALE, backend="fla", num_splits=ns)
        _check(out, ref, lens, 1e-2, (page_size, ns))
    # batch 1 at 20k keys: the default split count spreads it over the GPU
    x1 = {n: t[3:4] if n in ("q", "block_table", "context_lens") else t for n, t in x.items()}
    _check(paged_decode_attention(**x1, scale=SCALE), ref[3:4], [20000], 1e-2, "batch 1")


def test_fp32_matches_twin():
    """fp32 inputs take exact fp32 dots (no tf32): the twin's precision."""
    lens = [3, 0, 517, 2049]
    x, _, _ = paged_inputs(lens, 9, 3, 64, 40, 16, seed=1, device="cuda")  # SmolLM2-like group of 3
    ref = paged_decode_attention_torch(**{n: t.cpu() for n, t in x.items()}, scale=0.125)
    for ns in (None, 1):
        _check(paged_decode_attention(**x, scale=0.125, num_splits=ns).cpu(), ref, lens, 1e-5, ns)


def test_cuda_graph_replay_with_new_tables():
    N, page_size, max_len = 4, 16, 20000
    max_blocks = -(-max_len // page_size) + 1
    P = N * max_blocks + 5
    g = torch.Generator(device="cuda").manual_seed(0)
    k_cache = torch.randn(P, page_size, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v_cache = torch.randn(P, page_size, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.zeros(N, HQ, D, device="cuda", dtype=torch.bfloat16)
    block_table = torch.zeros(N, max_blocks, device="cuda", dtype=torch.int32)
    context_lens = torch.zeros(N, device="cuda", dtype=torch.int32)

    def fill(lens: list[int]) -> None:  # new contents, same tensors
        ids = torch.randperm(P, device="cuda", generator=g)[: N * max_blocks].view(N, max_blocks)
        block_table.copy_(ids.to(torch.int32))
        context_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn(N, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g))

    def run() -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, block_table, context_lens, scale=SCALE, backend="fla")

    fill([1, 100, 2049, 20000])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile outside the capture
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    prev = None
    for lens in ([1, 100, 2049, 20000], [20000, 0, 3, 17], [0, 0, 0, 0], [5000, 16, 15, 2049]):
        fill(lens)
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_decode_attention_torch(q, k_cache, v_cache, block_table, context_lens, scale=SCALE)
        _check(out, ref, lens, 1e-2, lens)
        if prev is not None:
            assert not torch.equal(out, prev)  # the replay computed something new
        prev = out.clone()

    # replay time, printed for the log (not asserted)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fill([20000, 20000, 20000, 20000])
    t0.record()
    for _ in range(20):
        graph.replay()
    t1.record()
    torch.cuda.synchronize()
    print(f"paged decode attention, 4 x 20000 keys, graph replay: {t0.elapsed_time(t1) / 20 * 1000:.1f} us")
