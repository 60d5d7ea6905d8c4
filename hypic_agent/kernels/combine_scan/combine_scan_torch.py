"""Plain-PyTorch twins of the combine scan (fp32): ``gdn_combine_scan_torch`` the whole scan (a token
loop; twin of ``combine_scan.gdn_combine_scan``) and ``wy_factors_torch`` the chunk factors (twin of
``combine_scan_triton.wy_factors_triton``, via ``gdn_torch``'s chunk factors).
"""

from __future__ import annotations

import torch

from ..gdn import gdn_torch
from .combine_scan_plan import ChainLink, Piece


def gdn_combine_scan_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chain: list[ChainLink],
    h0: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    transition: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference. q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]`` (g: log decay);
    h0 ``[HV, K, V]``. Returns o ``[T, HV, V]`` (v's dtype) and the final state ``[HV, K, V]`` fp32."""
    qp, kp, vp, gp, bp = gdn_torch.prepare(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, scale=scale)
    h = h0.float().clone()
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for link in chain:
        if isinstance(link, Piece):
            a, b = link.start, link.end
            if b > a:
                oo, hh = gdn_torch.recurrent(qp[None, a:b], kp[None, a:b], vp[None, a:b], gp[None, a:b], bp[None, a:b],
                                             h[None])  # fmt: skip
                o[a:b], h = oo[0], hh[0]
        else:
            h = (torch.bmm(link.T.float(), h) if transition else h) + link.S.float()
    return o.to(v.dtype), h


def wy_factors_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunks: torch.Tensor,
    chunk_size: int,
    *,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
) -> tuple[torch.Tensor, ...]:
    """Twin of ``combine_scan_triton.wy_factors_triton`` (same arguments and outputs: w, kd, qp
    ``[T, HV, K]``, u, ol ``[T, HV, V]``, gam ``[NC, HV]``, fp32; rows outside every chunk zero)."""
    qp_, kp, vp, gp, bp = gdn_torch.prepare(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, scale=scale)
    T, HV, K = kp.shape
    V = vp.shape[-1]
    w, kd, qp = (kp.new_zeros(T, HV, K) for _ in range(3))
    u, ol = (vp.new_zeros(T, HV, V) for _ in range(2))
    gam = kp.new_ones(chunks.shape[0], HV)
    for i, (a, b) in enumerate(chunks.tolist()):
        if not 0 < b - a <= chunk_size:
            raise ValueError(f"chunk [{a}, {b}) must hold 1..{chunk_size} tokens")

        def heads(x: torch.Tensor, a: int = a, b: int = b) -> torch.Tensor:
            return x[a:b].transpose(0, 1)[None]  # [1, HV, n, ...]

        uu, ww, qd, kdd, attn, decay = gdn_torch._chunk_factors(
            heads(qp_), heads(kp), heads(vp), gp[a:b].T[None], bp[a:b].T[None]
        )
        w[a:b], kd[a:b], u[a:b] = ww[0].transpose(0, 1), kdd[0].transpose(0, 1), uu[0].transpose(0, 1)
        qp[a:b] = (qd - attn @ ww)[0].transpose(0, 1)
        ol[a:b] = (attn @ uu)[0].transpose(0, 1)
        gam[i] = decay[0]
    return w, kd, qp, u, ol, gam
