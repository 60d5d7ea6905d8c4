"""Plain-PyTorch twin of ``gdn_decode_slots``: gather the live rows' states from the pool, run the
exact recurrent step (``gdn_torch.prepare`` + ``gdn_torch.recurrent``, the same math as
``gdn.gated_delta_rule_step``), write the new states back into their slots.

Layouts: q, k ``[N, H, K]``; v ``[N, HV, V]``; g, beta ``[N, HV]``; state_pool ``[S, HV, K, V]`` fp32;
slots ``[N]`` (a negative slot marks a padding row). The reference for the Triton kernel and the
CPU path; finding the live rows reads ``slots`` on the host, so it is not CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from ..gdn import gdn_torch


def gdn_decode_slots_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """One decode step of N rows against ``state_pool[slots]``, updated in place.

    Returns o ``[N, HV, V]`` in q's dtype; padding rows (``slots < 0``) get zeros and touch no state.
    """
    N, HV, V = v.shape
    o = q.new_zeros(N, HV, V)
    rows = (slots >= 0).nonzero().flatten()
    if rows.numel() == 0:
        return o
    idx = slots[rows].long()
    qp, kp, vp, gp, bp = gdn_torch.prepare(
        q[rows], k[rows], v[rows], g[rows], beta[rows], use_qk_l2norm=use_qk_l2norm, scale=scale
    )
    oo, st = gdn_torch.recurrent(qp[:, None], kp[:, None], vp[:, None], gp[:, None], bp[:, None], state_pool[idx])
    state_pool[idx] = st.to(state_pool.dtype)
    o[rows] = oo[:, 0].to(o.dtype)
    return o
