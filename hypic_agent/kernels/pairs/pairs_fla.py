"""fla-core twin of ``pairs_torch.transition_pairs_torch`` (CUDA only; imported lazily by ``pairs``).

Pipeline (as in fla's chunked GDN forward): L2-normalise k, chunk-local cumsum of g in log2
space, WY factors ``w, u`` per chunk, then ``chunk_cp_fwd_h(..., multi_seqs=True)`` writes the
summary ``hm [N, HV, K, V+K] = [h_local | M]`` with ``h_out = M @ h_in + h_local``.
Inputs are promoted to fp32 so that the stored pair does not inherit bf16 WY factors.
"""

from __future__ import annotations

import torch
from fla.ops.cp.chunk_fwd import chunk_cp_fwd_h
from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
from fla.ops.utils import chunk_local_cumsum
from fla.ops.utils.constant import RCP_LN2
from fla.ops.utils.index import prepare_chunk_indices

from .._varlen import as_int64
from ..gdn.gdn_torch import l2norm

CHUNK = 64


def transition_pairs_fla(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """k ``[T, H, K]``, v ``[T, HV, V]``, g/beta ``[T, HV]``, cu_seqlens ``[N+1]`` ->
    (T ``[N, HV, K, K]``, S ``[N, HV, K, V]``) fp32."""
    K = k.shape[-1]
    HV, V = v.shape[-2:]
    n = cu_seqlens.numel() - 1
    cu = as_int64(cu_seqlens)  # same object across layers: fla caches chunk indices by identity
    kf = (l2norm(k.float()) if use_qk_l2norm else k.float()).contiguous()[None]
    vf = v.float().contiguous()[None]
    bf = beta.float().contiguous()[None]
    idx = prepare_chunk_indices(cu, CHUNK)
    gc = chunk_local_cumsum(
        g.float().contiguous()[None], chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=idx
    )
    w, u, _ = chunk_gated_delta_rule_fwd_intra(
        k=kf, v=vf, g=gc, beta=bf, cu_seqlens=cu, chunk_size=CHUNK, chunk_indices=idx
    )
    hm = kf.new_empty(n, HV, K, V + K, dtype=torch.float32)
    chunk_cp_fwd_h(k=kf, w=w, u=u, hm=hm, g=gc, cu_seqlens=cu, chunk_size=CHUNK, multi_seqs=True)
    return hm[..., V:].contiguous(), hm[..., :V].contiguous()
