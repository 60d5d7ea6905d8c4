"""Plain-PyTorch twin of ``pairs.transition_pairs`` (the reference; ``pairs_fla`` on CUDA).

The gated delta rule run with value dim ``V + K``, values ``[v | 0]`` and initial state ``[0 | I]``
(``gdn_torch.chunked``): the final state splits into ``[S_C | T_C]``.
"""

from __future__ import annotations

import torch

from ..gdn import gdn_torch


def transition_pairs_torch(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """k ``[T, H, K]``, v ``[T, HV, V]``, g/beta ``[T, HV]``, cu_seqlens ``[N+1]`` ->
    (T ``[N, HV, K, K]``, S ``[N, HV, K, V]``) fp32."""
    total, _, K = k.shape
    HV, V = v.shape[-2:]
    n = cu_seqlens.numel() - 1
    _, kp, vp, gp, bp = gdn_torch.prepare(k, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, scale=1.0)
    v_ext = torch.cat([vp, vp.new_zeros(total, HV, K)], dim=-1)  # [T, HV, V+K]
    h0 = vp.new_zeros(n, HV, K, V + K)
    h0[..., V:] = torch.eye(K, dtype=vp.dtype, device=vp.device)
    _, hm = gdn_torch.chunked(kp, kp, v_ext, gp, bp, cu_seqlens, h0)
    return hm[..., V:].contiguous(), hm[..., :V].contiguous()
