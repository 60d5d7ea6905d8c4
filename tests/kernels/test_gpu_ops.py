"""GPU: fla causal conv, attention and MoE on CUDA against the torch references."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.attention import attention
from hypic_agent.kernels.conv import causal_conv1d
from hypic_agent.kernels.moe import moe_experts
from hypic_agent.kernels.rope import apply_rope
from tests.kernels.helpers import rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("lens", [[100, 1, 2, 0, 300], [2500, 3, 700]])  # Triton kernel (short), fla (long)
def test_conv_matches_torch(dtype, tol, with_state, lens):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    C, W = 384, 4
    x = torch.randn(sum(lens), C, device="cuda", dtype=dtype)
    w = torch.randn(C, W, device="cuda", dtype=dtype)
    b = torch.randn(C, device="cuda", dtype=dtype)
    h0 = torch.randn(len(lens), C, W - 1, device="cuda", dtype=dtype) if with_state else None
    y_f, s_f = causal_conv1d(x, w, b, cu_seqlens=cu, initial_state=h0, backend="fla")
    y_t, s_t = causal_conv1d(x, w, b, cu_seqlens=cu, initial_state=h0, backend="torch")
    print(f"conv {dtype} state={with_state}: rel err y {rel_err(y_f, y_t):.2e}")
    assert rel_err(y_f, y_t) < tol
    assert torch.equal(s_f, s_t)


def test_attention_cuda_matches_cpu():
    cu = torch.tensor([0, 50, 51, 300], dtype=torch.int32)
    q, k, v = torch.randn(300, 8, 64), torch.randn(300, 2, 64), torch.randn(300, 2, 64)
    ref = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
    out = attention(*(t.cuda() for t in (q, k, v)), cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda())
    assert rel_err(out.cpu(), ref) < 1e-3
    pos = torch.randperm(300)
    ref = attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, q_positions=pos, k_positions=pos)
    out = attention(
        *(t.cuda() for t in (q, k, v)),
        cu_seqlens_q=cu.cuda(),
        cu_seqlens_k=cu.cuda(),
        q_positions=pos.cuda(),
        k_positions=pos.cuda(),
    )
    assert rel_err(out.cpu(), ref) < 1e-3


@pytest.mark.parametrize("shape", [(210, 16, 2, 256, 20530), (1, 16, 2, 256, 20530), (37, 8, 2, 64, 999)])
def test_splitk_attention_matches_sdpa(shape):
    """The split-K kernel (what CUDA runs for few queries over many keys) against SDPA with the
    position mask, at the Qwen3.5 combine shape (210 active tokens over 20.5k keys, 16 / 2 heads
    of 256), at decode and at a small odd shape; prints both timings."""
    from hypic_agent.kernels.attention.attention_triton import splitk_attention_triton

    Tq, Hq, Hkv, D, Tk = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(Tq, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(Tk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(Tk, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    kp = torch.arange(Tk, device="cuda")
    qp = torch.sort(torch.randperm(Tk, device="cuda", generator=g)[:Tq]).values
    ref = attention(q, k, v, q_positions=qp, k_positions=kp, backend="torch")
    out = splitk_attention_triton(q, k, v, qp, kp, D**-0.5)
    via = attention(q, k, v, q_positions=qp, k_positions=kp)  # the dispatcher picks split-K
    err = rel_err(out.float(), ref.float())
    assert err < 1e-2 and torch.equal(out, via), err
    asc = splitk_attention_triton(q, k, v, qp, kp, D**-0.5, keys_ascending=True)  # the branch-free key loop
    assert rel_err(asc.float(), ref.float()) < 1e-2

    def ms(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(20):
            fn()
        t1.record()
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) / 20

    t_sdpa = ms(lambda: attention(q, k, v, q_positions=qp, k_positions=kp, backend="torch"))
    t_split = ms(lambda: splitk_attention_triton(q, k, v, qp, kp, D**-0.5))
    t_asc = ms(lambda: splitk_attention_triton(q, k, v, qp, kp, D**-0.5, keys_ascending=True))
    print(
        f"attention {shape}: rel err {err:.2e}, SDPA+mask {t_sdpa:.3f} ms, split-K {t_split:.3f} ms, "
        f"ascending keys {t_asc:.3f} ms"
    )


@pytest.mark.parametrize("T", [1, 100, 300, 600])  # 4 slots each: Triton up to max_slots pairs, grouped above
def test_moe_grouped_matches_loop(T):
    torch.manual_seed(0)
    D, I, E, k = 256, 128, 16, 4
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    gu = torch.randn(E, 2 * I, D, device="cuda", dtype=torch.bfloat16) / D**0.5
    dn = torch.randn(E, D, I, device="cuda", dtype=torch.bfloat16) / I**0.5
    idx = torch.randint(0, E - 1, (T, k), device="cuda")  # last expert never hit
    w = torch.softmax(torch.randn(T, k, device="cuda"), -1)
    out = moe_experts(x, idx, w, gu, dn, backend="auto")
    ref = moe_experts(x.float(), idx, w, gu.float(), dn.float(), backend="torch")
    print(f"moe bf16 vs fp32 loop, {T} tokens: rel err {rel_err(out.float(), ref):.2e}")
    assert rel_err(out.float(), ref) < 2e-2


def test_rope_cuda_matches_cpu():
    x, pos = torch.randn(64, 4, 128), torch.randint(0, 100000, (64,))
    ref = apply_rope(x, pos, rotary_dim=64, theta=1e7)
    out = apply_rope(x.cuda(), pos.cuda(), rotary_dim=64, theta=1e7).cpu()
    assert (out - ref).abs().max() < 1e-3


def test_gather_spans_cuda_matches_twin():
    """The span gather (conv tails and attention bodies by pointer) on CUDA against its torch twin."""
    from hypic_agent.kernels.gather_spans import gather_spans, gather_spans_torch, span_table

    g = torch.Generator().manual_seed(0)
    for dt in (torch.bfloat16, torch.float32):
        srcs = [torch.randn(n, generator=g).to("cuda", dt) for n in (520_192, 24_576, 3)] + [None]
        numels, offsets = [520_192, 24_576, 3, 24_576], [0, 520_192, 544_768, 544_771]
        table = span_table([(0 if s is None else s.data_ptr(), o, n) for s, o, n in zip(srcs, offsets, numels)])
        dst = torch.full((569_347,), 7.0, dtype=dt, device="cuda")
        ref = gather_spans_torch(srcs, offsets, numels, dst.clone())
        got = gather_spans(table.cuda(), dst, max(numels))
        assert torch.equal(got, ref)
