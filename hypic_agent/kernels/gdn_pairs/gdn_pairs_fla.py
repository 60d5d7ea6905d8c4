"""fla-core path of ``gdn_pairs`` (CUDA only; imported lazily by its dispatcher, which it does not import).

One varlen pass over the split's sub-sequences (every segment cut into its seam window and its
body), through fla's forward stages called one by one (as ``chunk_gated_delta_rule_fwd`` composes
them): chunk-local cumsum of g (log2 space) -> WY factors ``w, u`` once for everything. The windows'
rows of those factors give their zero-start states (a small gathered state pass): the states
entering the bodies. The forward runs all sub-sequences from them; the same factors and the
forward's final states give the body pairs (``body_pairs``: each transition from the identity, and a
body's zero-start state as its final state less ``T_body S_win``), written straight into the
entries (``PairSink``). Chunk tables come from the host (``SeamSplit``): no device sync.
q and k are L2-normalised once, up front.

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

from .._varlen import as_int64
from ..body_pairs import body_pairs
from ..pair_sink import PairSink
from ..seam_split import CHUNK, SeamSplit
from .gdn_pairs_torch import EnterFn


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
    finals ``[P, HV, K, V]``, T ``[P, HV, K, K]``, S ``[P, HV, K, V]``), fp32 states.
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


def _window_states(
    k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, gc: torch.Tensor, split: SeamSplit
) -> torch.Tensor:
    """Zero-start final states of the seam windows ``[Nw, HV, K, V]`` fp32: their rows of the shared
    factors (k ``[1, T, H, K]``, w ``[1, T, HV, K]``, u ``[1, T, HV, V]``, gc ``[1, T, HV]``) gathered
    (each window is a sequence of its own in both layouts, so its chunk-local factors are the same)
    through fla's state pass."""
    i = split.win_idx
    if i.numel() == 0:
        return u.new_zeros(0, u.shape[2], k.shape[-1], u.shape[-1], dtype=torch.float32)
    _, _, S_win = chunk_gated_delta_rule_fwd_h(
        k=k[:, i], w=w[:, i], u=u[:, i], g=gc[:, i], output_final_state=True, chunk_size=CHUNK, save_new_value=False,
        cu_seqlens=split.cu_win, chunk_indices=split.win_chunks, chunk_offsets=split.win_chunk_offsets,
    )  # fmt: skip
    assert S_win is not None
    return S_win


def gdn_with_pairs_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    split: SeamSplit,
    use_qk_l2norm: bool,
    scale: float | None,
    sink: PairSink,
    finals: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]`` -> (o ``[T, HV, V]``, the segments'
    final states ``[N, HV, K, V]`` fp32 when ``finals``, else None); body pairs into ``sink``.

    WY factors once over the sub-sequences -> the windows' zero-start states (a small gathered pass)
    -> the forward from them (bodies enter from their window) -> the body pairs from the same
    factors and the forward's final states (``body_pairs``: transitions from the identity,
    ``S_body = fin - T_body S_win``), written into the entries."""
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    q, k = _l2norm_qk(q, k, use_qk_l2norm)
    qb, kb, vb = q[None].contiguous(), k[None].contiguous(), v[None].contiguous()
    cu, idx, offsets = split.cu_sub, split.sub_chunks, split.sub_chunk_offsets
    gc = chunk_local_cumsum(g.float()[None].contiguous(), chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu,
                            chunk_indices=idx)  # fmt: skip
    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=kb, v=vb, g=gc, beta=beta.to(q.dtype)[None].contiguous(), cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=idx
    )
    S_win_z = split.with_zero_row(_window_states(kb, w, u, gc, split))
    h, v_new, fin = chunk_gated_delta_rule_fwd_h(
        k=kb, w=w, u=u, g=gc, initial_state=split.enter_from_windows(S_win_z), output_final_state=True,
        chunk_size=CHUNK, cu_seqlens=cu, chunk_indices=idx, chunk_offsets=offsets,
    )  # fmt: skip
    o = chunk_fwd_o(q=qb, k=kb, v=v_new, h=h, g=gc, scale=scale, cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=idx)
    assert fin is not None
    body_pairs(kb, w, gc, fin, S_win_z, split, sink, backend="fla")
    return o[0], split.segment_finals(fin) if finals else None


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
