"""Plain-PyTorch twin of ``conv_decode_slots``: gather the live rows' conv states from the pool, run
``conv.causal_conv1d_step``, write the shifted states back into their slots.

Layouts: x ``[N, C]``; conv_pool ``[S, C, W-1]`` (the last W-1 inputs of each request, oldest
first); slots ``[N]`` (negative = padding row); weight ``[C, W]``; bias ``[C]`` or None. The
reference for the Triton kernel and the CPU path; finding the live rows reads ``slots`` on the
host, so it is not CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from ..conv import causal_conv1d_step


def conv_decode_slots_torch(
    x: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One conv decode step of N rows against ``conv_pool[slots]``, updated in place.

    Returns y ``[N, C]`` in x's dtype; padding rows (``slots < 0``) get zeros and write no state.
    """
    y = torch.zeros_like(x)
    rows = (slots >= 0).nonzero().flatten()
    if rows.numel() == 0:
        causal_conv1d_step(x[:0], conv_pool[:0], weight, bias, activation)  # validate as a live step would
        return y
    idx = slots[rows].long()
    yy, st = causal_conv1d_step(x[rows], conv_pool[idx], weight, bias, activation)
    conv_pool[idx] = st.to(conv_pool.dtype)
    y[rows] = yy
    return y
