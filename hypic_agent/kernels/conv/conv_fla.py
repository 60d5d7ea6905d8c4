"""fla-core wrapper for ``conv.causal_conv1d`` (CUDA; imported lazily).

fla keeps a conv state of width W (``[N, C, W]``, the last W inputs; only the last W-1 are read),
ours is ``[N, C, W-1]``: we pad one zero column in front on the way in and drop it on the way out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fla.modules.causal_conv1d import causal_conv1d as fla_causal_conv1d

from .._varlen import as_int64


def causal_conv1d_fla(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    activation: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[T, C]``, weight ``[C, W]``, state ``[N, C, W-1]`` -> (y ``[T, C]``, final ``[N, C, W-1]``)."""
    h0 = None if initial_state is None else F.pad(initial_state.to(x.dtype), (1, 0)).contiguous()
    act = None if activation in (None, "identity") else activation
    y, final = fla_causal_conv1d(
        x[None].contiguous(),
        weight=weight.contiguous(),
        bias=bias,
        initial_state=h0,
        output_final_state=True,
        activation=act,
        cu_seqlens=as_int64(cu_seqlens),
    )
    return y[0], final[..., 1:].contiguous()
