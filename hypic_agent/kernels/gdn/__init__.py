"""Gated delta rule (Gated DeltaNet linear attention): prefill over packed sequences and decode step.

Layouts (docs/architecture.md): q, k ``[T, H, K]``; v ``[T, HV, V]``; g (log decay, <= 0) and
beta ``[T, HV]``; state ``[N, HV, K, V]`` fp32, keys -> values. GVA: query/key head ``h`` serves
value heads ``h*r .. h*r+r-1`` with ``r = HV // H``.

On CUDA (``backend`` "auto" / "fla") fla-core's chunked and fused recurrent kernels run
(``gdn_fla``); elsewhere the plain-PyTorch twin (``gdn_torch``: a chunked WY form and the per-token
recurrence, also the helpers other ops build on: ``prepare``, ``l2norm``, ``wy_factors``).
"""

from __future__ import annotations

import torch

from .._varlen import normalize_cu_seqlens
from ..backend import resolve_backend
from . import gdn_torch


def _check_state(state: torch.Tensor | None, n: int, hv: int, kd: int, vd: int, name: str) -> None:
    if state is not None and tuple(state.shape) != (n, hv, kd, vd):
        raise ValueError(f"{name} must be [N, HV, K, V] = {(n, hv, kd, vd)}, got {tuple(state.shape)}")


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the gated delta rule over N packed sequences.

    Args:
        q, k: ``[T, H, K]``; v: ``[T, HV, V]``; g, beta: ``[T, HV]``.
        cu_seqlens: ``[N+1]`` int32 (None = one sequence).
        initial_state: ``[N, HV, K, V]`` (None = zeros).
        scale: query scale, default ``K ** -0.5`` (applied after the optional L2 norm).
    Returns:
        o ``[T, HV, V]`` in q's dtype, final state ``[N, HV, K, V]`` fp32 (or None).
    """
    T, _, K = k.shape
    HV, V = v.shape[-2:]
    cu = normalize_cu_seqlens(cu_seqlens, T, q.device)
    n = cu.numel() - 1
    _check_state(initial_state, n, HV, K, V, "initial_state")
    if resolve_backend(backend, q.device) == "fla":
        from .gdn_fla import chunk_gdn_fla

        o, st = chunk_gdn_fla(q, k, v, g, beta, cu, initial_state, use_qk_l2norm, scale)
    else:
        qp, kp, vp, gp, bp = gdn_torch.prepare(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, scale=scale)
        h0 = initial_state if initial_state is not None else q.new_zeros(n, HV, K, V, dtype=torch.float32)
        o, st = gdn_torch.chunked(qp, kp, vp, gp, bp, cu, h0)
    return o.to(q.dtype), (st.float() if output_final_state else None)


def gated_delta_rule_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token recurrent reference of ``gated_delta_rule`` (slow; for tests). Same layouts."""
    T, _, K = k.shape
    HV, V = v.shape[-2:]
    cu = normalize_cu_seqlens(cu_seqlens, T, q.device)
    n = cu.numel() - 1
    _check_state(initial_state, n, HV, K, V, "initial_state")
    qp, kp, vp, gp, bp = gdn_torch.prepare(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, scale=scale)
    o = vp.new_zeros(T, HV, V)
    states = []
    bounds = cu.tolist()
    for i in range(n):
        a, b = bounds[i], bounds[i + 1]
        h0 = initial_state[i : i + 1] if initial_state is not None else vp.new_zeros(1, HV, K, V)
        oi, si = gdn_torch.recurrent(qp[None, a:b], kp[None, a:b], vp[None, a:b], gp[None, a:b], bp[None, a:b], h0)
        o[a:b] = oi[0]
        states.append(si)
    return o.to(q.dtype), torch.cat(states) if states else vp.new_zeros(0, HV, K, V)


def gated_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool = True,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step for N sequences.

    q, k ``[N, H, K]``; v ``[N, HV, V]``; g, beta ``[N, HV]``; state ``[N, HV, K, V]``.
    Returns o ``[N, HV, V]`` (q's dtype) and the new state ``[N, HV, K, V]`` fp32 (a new tensor;
    the input state is not modified).
    """
    N, _, K = k.shape
    HV, V = v.shape[-2:]
    _check_state(state, N, HV, K, V, "state")
    if resolve_backend(backend, q.device) == "fla":
        from .gdn_fla import step_gdn_fla

        o, st = step_gdn_fla(q, k, v, g, beta, state, use_qk_l2norm, scale)
    else:
        qp, kp, vp, gp, bp = gdn_torch.prepare(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, scale=scale)
        o, st = gdn_torch.recurrent(qp[:, None], kp[:, None], vp[:, None], gp[:, None], bp[:, None], state)
        o = o[:, 0]
    return o.to(q.dtype), st.float()
