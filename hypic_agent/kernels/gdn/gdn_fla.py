"""fla-core wrappers for ``gdn.gated_delta_rule`` / ``gated_delta_rule_step`` (CUDA; imported lazily).

fla takes ``[B=1, T, H, K]`` with int64 ``cu_seqlens`` for packed sequences (``as_int64`` keeps
the same object across layers so fla's identity cache of chunk indices hits), handles GVA
itself (value head i reads key head ``i // (HV // H)``, same as repeat_interleave), L2-normalises
q/k in-kernel and defaults ``scale`` to ``K ** -0.5``. States are ``[N, HV, K, V]`` fp32.
"""

from __future__ import annotations

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

from .._varlen import as_int64


def chunk_gdn_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    use_qk_l2norm: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``; cu_seqlens ``[N+1]``;
    initial_state ``[N, HV, K, V]`` or None -> (o ``[T, HV, V]``, final ``[N, HV, K, V]`` fp32)."""
    o, st = chunk_gated_delta_rule(
        q[None].contiguous(),
        k[None].contiguous(),
        v[None].contiguous(),
        g.float()[None].contiguous(),
        beta.to(q.dtype)[None].contiguous(),
        scale=scale,
        initial_state=None if initial_state is None else initial_state.float().contiguous(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
        cu_seqlens=as_int64(cu_seqlens),
    )
    return o[0], st


def step_gdn_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k ``[N, H, K]``; v ``[N, HV, V]``; g, beta ``[N, HV]``;
    state ``[N, HV, K, V]`` -> (o ``[N, HV, V]``, new state fp32). Runs as B=N, T=1."""
    o, st = fused_recurrent_gated_delta_rule(
        q[:, None].contiguous(),
        k[:, None].contiguous(),
        v[:, None].contiguous(),
        g=g.float()[:, None].contiguous(),
        beta=beta.to(q.dtype)[:, None].contiguous(),
        scale=scale,
        initial_state=state.float().contiguous(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
    )
    return o[:, 0], st
