"""Plain-PyTorch twin of ``body_pairs.body_pairs`` (the fp32 reference; ``body_pairs_triton`` on CUDA).

Per segment, the state pass on the identity with zero values, chunk by chunk through the forward's
WY factors (``T_body``), then ``S_body = fin_body - T_body S_win`` from the stored ``T_body``; layouts
in ``body_pairs``.
"""

from __future__ import annotations

import itertools

import torch

from ..pair_sink import PairSink
from ..seam_split import CHUNK, SeamSplit


def body_pairs_torch(
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    fin: torch.Tensor,
    S_win_z: torch.Tensor,
    split: SeamSplit,
    sink: PairSink,
) -> None:
    """Reference. k ``[1, T, H, K]``, w ``[1, T, HV, K]``, gc ``[1, T, HV]``, fin ``[M, HV, K, V]``,
    S_win_z ``[Nw+1, HV, K, V]`` (the windows' zero-start states and a zero row) -> ``sink``."""
    H, K = k.shape[2], k.shape[3]
    HV = w.shape[2]
    cu = [0, *itertools.accumulate(split.sub_lens)]  # host bounds: no device read
    eye = torch.eye(K, dtype=torch.float32, device=k.device).expand(HV, K, K)
    for j, (sub, win) in enumerate(zip(split.seg_body_sub_host, split.seg_body_win_host, strict=True)):
        if sub < 0:
            sink.T[j].copy_(eye)
            sink.S[j].zero_()
            continue
        h = eye.clone()
        for lo in range(cu[sub], cu[sub + 1], CHUNK):
            hi = min(lo + CHUNK, cu[sub + 1])
            ww = w[0, lo:hi].float().transpose(0, 1)  # [HV, L, K]
            kk = k[0, lo:hi].float().repeat_interleave(HV // H, dim=1).transpose(0, 1)  # [HV, L, K]
            g = gc[0, lo:hi].float().T  # [HV, L]
            g_last = g[:, -1:]
            v_new = -(ww @ h) * torch.exp2(g_last - g)[..., None]
            h = h * torch.exp2(g_last)[..., None] + kk.transpose(-1, -2) @ v_new
        sink.T[j].copy_(h)
        sink.S[j].copy_(fin[sub].float() - sink.T[j].float() @ S_win_z[win].float())
