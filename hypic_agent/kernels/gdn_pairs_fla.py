"""fla-core implementation of ``gdn_pairs.gated_delta_rule_with_pairs`` (CUDA only; imported lazily).

Pass 1: seam windows from zero states (``chunk_gated_delta_rule``, a few tokens per segment).
Pass 2: bodies from the windows' final states, through fla's forward stages called one by one
(as ``chunk_gated_delta_rule_fwd`` composes them): chunk-local cumsum of g (log2 space) -> WY
factors ``w, u`` -> chunk states ``h`` -> outputs. The same ``w, u, g`` then feed
``chunk_cp_fwd_h(..., multi_seqs=True)``, which writes ``hm [Nb, HV, K, V+K] = [S_body | T_body]``
(from a zero state; the incoming state does not enter). q and k are L2-normalised once, up front.

``gdn_after_pairs_fla`` (combine): WY factors once -> the pieces' pairs -> caller's chain gives the
incoming states -> chunk states and outputs from those states, reusing the same factors.
"""

from __future__ import annotations

import torch
from fla.modules.norm.l2norm import l2norm_fwd
from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
from fla.ops.common.chunk_o import chunk_fwd_o
from fla.ops.cp.chunk_fwd import chunk_cp_fwd_h
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
from fla.ops.utils import chunk_local_cumsum
from fla.ops.utils.constant import RCP_LN2
from fla.ops.utils.index import prepare_chunk_indices

from ._varlen import as_int64
from .gdn_pairs import EnterFn, SeamSplit, identity_pairs

CHUNK = 64


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One set of WY factors for P packed sequences (q, k already L2-normalised): their pairs from a
    zero state, then their outputs from ``enter(T, S)``.

    q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``; cu ``[P+1]`` int64 -> (o ``[T, HV, V]``,
    finals ``[P, HV, K, V]``, T ``[P, HV, K, K]``, S ``[P, HV, K, V]``), states fp32.
    """
    K = k.shape[-1]
    HV, V = v.shape[-2:]
    qb, kb, vb = q[None].contiguous(), k[None].contiguous(), v[None].contiguous()
    idx = prepare_chunk_indices(cu, CHUNK)
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
        chunk_indices=idx,
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
    K = k.shape[-1]
    HV, V = v.shape[-2:]
    scale = K**-0.5 if scale is None else scale
    q, k = _l2norm_qk(q, k, use_qk_l2norm)
    o = torch.empty(q.shape[0], HV, V, dtype=q.dtype, device=q.device)
    finals = torch.zeros(split.n, HV, K, V, dtype=torch.float32, device=q.device)
    T, S = identity_pairs(split.n, HV, K, V, q.device)
    if split.seam_segs:  # pass 1: seam windows from zero
        s = split.seam_idx
        o_s, fin_s = chunk_gated_delta_rule(
            q[s][None], k[s][None], v[s][None], g.float()[s][None], beta.to(q.dtype)[s][None],
            scale=scale, output_final_state=True, cu_seqlens=split.cu_seam,
        )  # fmt: skip
        o[s] = o_s[0]
        finals[split.seam_seg_idx] = fin_s.float()  # the bodies start here; final for all-window segments
    if split.body_segs:  # pass 2: bodies from the windows' states, WY factors shared with the pairs
        b = split.body_idx
        bs = split.body_seg_idx
        enter = finals[bs]
        o[b], finals[bs], T[bs], S[bs] = _wy_pass(
            q[b], k[b], v[b], g[b], beta[b], split.cu_body, lambda _T, _S: enter, scale
        )
    return o, finals, T, S


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
