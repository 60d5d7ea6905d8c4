"""Body pairs in Triton (CUDA; imported lazily). Twin: ``body_pairs_torch``.

Two launches per linear layer:

* ``_transition_kernel``, grid ``(cdiv(K, BV), N, HV)``: a ``[K, BV]`` column block of one
  segment's ``T_body`` for one value head, from the identity, chunk by chunk through the forward's
  WY factors (the state pass with zero values: two tensor-core dots per 64 tokens, the state
  rounded to the inputs' dtype for them as in fla's own state pass). Only the final state is
  written, into the sink; fla's state pass would also store all chunk states (~270 MB per layer
  for 16 x 1k tokens at 32 heads).
* ``_body_state_kernel``, grid ``(cdiv(V, BV), N, HV)``: ``S_body = fin - T_body S_win`` from the
  stored ``T_body`` (in ``[K, BC]`` blocks, tf32x3 dots: about fp32), into the sink.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pair_sink import PairSink
from ..seam_split import CHUNK, SeamSplit

_TY = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _transition_kernel(
    k, w, gc, cu, seg_sub, dst,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    OUT_TY: tl.constexpr,
):  # fmt: skip
    i_v = tl.program_id(0)
    i_n = tl.program_id(1)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_c = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_c = o_c < K
    b_h = tl.where(o_k[:, None] == o_c[None, :], 1.0, 0.0).to(tl.float32)  # identity columns [BK, BV]
    sub = tl.load(seg_sub + i_n)
    if sub >= 0:
        bos = tl.load(cu + sub)
        eos = tl.load(cu + sub + 1)
        for lo in range(bos, eos, BT):
            o_t = lo + tl.arange(0, BT)
            m_t = o_t < eos
            b_w = tl.load(w + (o_t[:, None] * HV + i_hv) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                          other=0.0)  # fmt: skip
            b_v = -tl.dot(b_w, b_h.to(b_w.dtype))  # [BT, BV]: -w h
            last = tl.minimum(lo + BT, eos) - 1
            g_last = tl.load(gc + last * HV + i_hv).to(tl.float32)
            b_g = tl.load(gc + o_t * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
            b_v = b_v * tl.where(m_t, tl.exp2(g_last - b_g), 0.0)[:, None]
            b_kt = tl.load(k + (o_t[None, :] * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :],
                           other=0.0)  # fmt: skip
            b_h = tl.dot(b_kt, b_v.to(b_kt.dtype), b_h * tl.exp2(g_last))
    p_t = tl.load(dst + i_n * 2).to(tl.pointer_type(OUT_TY))
    tl.store(p_t + i_hv * K * K + o_k[:, None] * K + o_c[None, :], b_h.to(OUT_TY), mask=m_k[:, None] & m_c[None, :])


@triton.jit
def _body_state_kernel(
    fin, s_win, seg_sub, seg_win, dst,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
    OUT_TY: tl.constexpr,
):  # fmt: skip
    i_v = tl.program_id(0)
    i_n = tl.program_id(1)
    i_hv = tl.program_id(2).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    sub = tl.load(seg_sub + i_n).to(tl.int64)
    win = tl.load(seg_win + i_n).to(tl.int64)
    p_s = tl.load(dst + i_n * 2 + 1).to(tl.pointer_type(OUT_TY))
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    if sub >= 0:
        p_t = tl.load(dst + i_n * 2).to(tl.pointer_type(OUT_TY))
        acc = tl.load(fin + (sub * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
        for c in tl.static_range(0, BK, BC):
            o_c = c + tl.arange(0, BC)
            m_c = o_c < K
            b_t = tl.load(p_t + i_hv * K * K + o_k[:, None] * K + o_c[None, :], mask=m_k[:, None] & m_c[None, :],
                          other=0.0).to(tl.float32)  # fmt: skip
            b_s = tl.load(s_win + (win * HV + i_hv) * K * V + o_c[:, None] * V + o_v[None, :],
                          mask=m_c[:, None] & m_v[None, :], other=0.0)  # fmt: skip
            acc -= tl.dot(b_t, b_s, input_precision="tf32x3")
    tl.store(p_s + i_hv * K * V + o_k[:, None] * V + o_v[None, :], acc.to(OUT_TY), mask=m_kv)


def body_pairs_triton(
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    fin: torch.Tensor,
    S_win_z: torch.Tensor,
    split: SeamSplit,
    sink: PairSink,
    *,
    bv: int = 64,
    num_warps: int = 4,
    bv_state: int = 64,
    warps_state: int = 4,
) -> None:
    """k ``[1, T, H, K]``, w ``[1, T, HV, K]``, gc ``[1, T, HV]`` fp32, fin ``[M, HV, K, V]`` fp32,
    S_win_z ``[Nw+1, HV, K, V]`` fp32 -> segment body pairs written into ``sink`` (its dtype).
    ``bv`` columns of ``T`` per program of the transition kernel, with ``num_warps``; ``bv_state`` /
    ``warps_state`` the same for the ``S`` kernel. Defaults: the fastest on the H200 at 16 x 1k tokens,
    HV = 32, K = V = 128, bf16 (both kernels 0.19 ms per layer, against 0.86 ms for fla's state pass on
    the identity plus the gathers, the ``S`` product and the per-entry copies it replaces)."""
    H, K = k.shape[2], k.shape[3]
    HV = w.shape[2]
    V = fin.shape[-1]
    N = split.n
    out_ty = _TY[sink.dtype]
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min(bv, BK))
    k, w, gc = k.contiguous(), w.contiguous(), gc.contiguous()
    _transition_kernel[(triton.cdiv(K, BV), N, HV)](
        k, w, gc, split.cu_sub, split.seg_body_sub, sink.pointers, H=H, HV=HV, K=K, BK=BK, BV=BV, BT=CHUNK,
        OUT_TY=out_ty, num_warps=num_warps,
    )  # fmt: skip
    BVS = max(16, min(bv_state, triton.next_power_of_2(V)))
    _body_state_kernel[(triton.cdiv(V, BVS), N, HV)](
        fin.float().contiguous(), S_win_z.float().contiguous(), split.seg_body_sub, split.seg_body_win,
        sink.pointers, HV=HV, K=K, V=V, BK=BK, BV=BVS, BC=min(BK, 32), OUT_TY=out_ty, num_warps=warps_state,
    )  # fmt: skip
