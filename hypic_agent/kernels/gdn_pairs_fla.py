"""fla-core implementation of ``gdn_pairs.gated_delta_rule_with_pairs`` (CUDA only; imported lazily).

One varlen pass over the split's sub-sequences (every segment cut into its seam window and its
body), through fla's forward stages called one by one (as ``chunk_gated_delta_rule_fwd`` composes
them): chunk-local cumsum of g (log2 space) -> WY factors ``w, u`` -> pairs -> chunk states ``h``
-> outputs. The same ``w, u, g`` feed ``chunk_cp_fwd_h(..., multi_seqs=True)``, which writes
``hm [M, HV, K, V+K] = [S | T]`` of every sub-sequence from a zero state. A window starts from zero,
so its final state is its ``S``: that is the state entering the body behind it, and the bodies'
``(T, S)`` are the entry pairs. No token is gathered or scattered, and the chunk tables come from
the host (``SeamSplit``): no device sync. q and k are L2-normalised once, up front.

``gdn_after_pairs_fla`` (combine): WY factors once -> the pieces' pairs -> caller's chain gives the
incoming states -> chunk states and outputs from those states, reusing the same factors.
"""

from __future__ import annotations

import torch
from fla.modules.norm.l2norm import l2norm_fwd
from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
from fla.ops.common.chunk_o import chunk_fwd_o
from fla.ops.cp.chunk_fwd import chunk_cp_fwd_h
from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
from fla.ops.utils import chunk_local_cumsum
from fla.ops.utils.constant import RCP_LN2
from fla.ops.utils.index import prepare_chunk_indices

from ._varlen import as_int64
from .gdn_pairs import CHUNK, EnterFn, SeamSplit


def _l2norm_qk(q: torch.Tensor, k: torch.Tensor, use: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not use:
        return q, k
    return l2norm_fwd(q.contiguous())[0], l2norm_fwd(k.contiguous())[0]


def _wy_pass(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu: torch.Tensor,
    enter: EnterFn,
    scale: float,
    chunks: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One set of WY factors for P packed sequences (q, k already L2-normalised): their pairs from a
    zero state, then their outputs from ``enter(T, S)``.

    q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``; cu ``[P+1]`` int64; ``chunks``: fla's
    chunk indices ``[NC, 2]`` and offsets ``[P+1]`` for ``cu`` (None: fla derives them, with a device
    sync) -> (o ``[T, HV, V]``, finals ``[P, HV, K, V]``, T ``[P, HV, K, K]``, S ``[P, HV, K, V]``), fp32 states.
    """
    K = k.shape[-1]
    HV, V = v.shape[-2:]
    qb, kb, vb = q[None].contiguous(), k[None].contiguous(), v[None].contiguous()
    idx, offsets = chunks if chunks is not None else (prepare_chunk_indices(cu, CHUNK), None)
    gc = chunk_local_cumsum(g.float()[None].contiguous(), chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu,
                            chunk_indices=idx)  # fmt: skip
    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=kb, v=vb, g=gc, beta=beta.to(q.dtype)[None].contiguous(), cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=idx
    )
    hm = torch.empty(cu.numel() - 1, HV, K, V + K, dtype=torch.float32, device=q.device)
    chunk_cp_fwd_h(k=kb, w=w, u=u, hm=hm, g=gc, cu_seqlens=cu, chunk_size=CHUNK, multi_seqs=True)
    T, S = hm[..., V:], hm[..., :V]
    h0 = enter(T, S).float().contiguous()
    h, v_new, fin = chunk_gated_delta_rule_fwd_h(
        k=kb, w=w, u=u, g=gc, initial_state=h0, output_final_state=True, chunk_size=CHUNK, cu_seqlens=cu,
        chunk_indices=idx, chunk_offsets=offsets,
    )  # fmt: skip
    o = chunk_fwd_o(q=qb, k=kb, v=v_new, h=h, g=gc, scale=scale, cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=idx)
    assert fin is not None
    return o[0], fin.float(), T, S


def gdn_with_pairs_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    split: SeamSplit,
    use_qk_l2norm: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]`` -> (o ``[T, HV, V]``, finals
    ``[N, HV, K, V]``, T_body ``[N, HV, K, K]``, S_body ``[N, HV, K, V]``), states fp32."""
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    q, k = _l2norm_qk(q, k, use_qk_l2norm)
    o, fin, T_sub, S_sub = _wy_pass(
        q, k, v, g, beta, split.cu_sub, lambda _T, S: split.enter_states(S), scale,
        (split.sub_chunks, split.sub_chunk_offsets),
    )  # fmt: skip
    return (o, *split.segment_results(fin, T_sub, S_sub))


def gdn_after_pairs_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    enter: EnterFn,
    use_qk_l2norm: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``; cu_seqlens ``[P+1]`` -> (o ``[T, HV, V]``,
    finals ``[P, HV, K, V]`` fp32); ``enter(T, S)`` maps the pieces' pairs to their incoming states."""
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    q, k = _l2norm_qk(q, k, use_qk_l2norm)
    o, fin, _, _ = _wy_pass(q, k, v, g, beta, as_int64(cu_seqlens), enter, scale)
    return o, fin
