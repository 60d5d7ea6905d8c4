"""Chain scan: push a running GDN state through a sequence of transition pairs.

``states[0] = h0`` and ``states[i+1] = T[i] @ states[i] + S[i]`` per value head, fp32. This is
the combine step of HYPIC linear layers (seam -> body -> seam ...). The torch reference is a
loop of batched matmuls (``chain_torch``); on CUDA (``"auto"`` or ``"fla"``) the fused Triton kernel
(``chain_triton``, one launch, full ``[K, K]`` tile in tf32x3). Measured on an H200 for 41 pairs
at HV=32, K=V=128 (``benchmarks/prefill_profile.py``): Triton 0.41 ms vs 2.05 ms for the cuBLAS
loop, relative difference 3.3e-7.
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from .chain_torch import chain_scan_torch, compose_bodies

__all__ = ["chain_scan", "chain_scan_torch", "compose_bodies", "compose_body_pointers"]


def chain_scan(
    h0: torch.Tensor,
    T: torch.Tensor,
    S: torch.Tensor,
    *,
    backend: str = "auto",
    chunked: bool = False,
    last_only: bool = False,
    state_bf16: bool = False,
) -> torch.Tensor:
    """Running states through n pairs.

    Args:
        h0: ``[HV, K, V]`` incoming state.
        T: ``[n, HV, K, K]`` transitions; S: ``[n, HV, K, V]`` zero-start states.
        backend: ``"torch"`` (loop), ``"fla"`` or ``"auto"`` (Triton on CUDA, the loop elsewhere).
        chunked: Triton variant (streamed T blocks with exact fp32 dots instead of a tf32x3 full tile).
        last_only: return only the state after all pairs (``[HV, K, V]``; the Triton scan then keeps
            every state in registers and writes one).
        state_bf16: Triton with bf16 pairs: one bf16 dot per pair, the state rounded to bf16 for it
            (faster, ~1e-3 relative error; see ``chain_scan_triton``). Ignored by the torch loop.
    Returns:
        ``[n+1, HV, K, V]`` fp32 with ``states[0] = h0`` and ``states[-1]`` the state after all pairs.
    """
    HV, K, V = h0.shape
    n = T.shape[0]
    if T.shape != (n, HV, K, K) or S.shape != (n, HV, K, V):
        raise ValueError(
            f"need T [n, HV, K, K] and S [n, HV, K, V] for h0 {tuple(h0.shape)}; "
            f"got {tuple(T.shape)} and {tuple(S.shape)}"
        )
    if backend in ("fla", "auto") and resolve_triton(backend, h0.device):
        from .chain_triton import chain_scan_triton

        return chain_scan_triton(
            h0, T, S, chunked=chunked and not last_only, last_only=last_only, state_bf16=state_bf16
        )
    states = chain_scan_torch(h0, T, S)
    return states[-1] if last_only else states


def compose_body_pointers(
    pointers: torch.Tensor, like: tuple[torch.Tensor, torch.Tensor], *, transition: bool = True
) -> torch.Tensor:
    """``compose_bodies`` in one Triton launch for chains given by their pairs' data pointers
    ``[L, n, 2]`` int64 on CUDA (``ChainTables.ptrs``); ``like``: one of the pairs (shapes, dtype).
    The pairs must be contiguous and of one dtype. Returns ``[L, HV, K, V]`` fp32."""
    from .chain_triton import chain_pointers_triton

    T, S = like
    hv, k, v = S.shape
    if T.shape != (hv, k, k) or T.dtype != S.dtype:
        raise ValueError(f"need T [HV, K, K] and S [HV, K, V] of one dtype; got {tuple(T.shape)}, {tuple(S.shape)}")
    return chain_pointers_triton(pointers, hv, k, v, S.dtype, transition=transition)
