"""Combine scan: one linear layer of a HYPIC combine in one pass over its chain.

The chain of a composed prompt alternates *pieces* (active tokens, recomputed in context) and
cached *bodies* (transition pairs). Starting from ``h0`` the running state ``h [HV, K, V]``

* runs the gated delta rule token by token through a piece, emitting each token's output, and
* jumps over a body with its pair: ``h <- T @ h + S`` (``h <- h + S`` for the ``addition`` ablation).

This is what ``pieces' own pairs -> chain_scan -> forward from entering states`` computes in three
passes; fused, it is one launch per layer with no stacking of the cached pairs (the Triton kernel
reads them through a pointer table). It pays off when the active tokens are few (seam windows and a
question: a few hundred tokens); long pieces go through the chunked path instead (``MAX_TOKENS``).

``gdn_combine_scan`` dispatches: on CUDA the Triton WY scan (``combine_scan_triton``, over the step
plan of ``combine_scan_plan``, which also holds the chain links and their pointer tables), elsewhere
the plain-PyTorch twin ``combine_scan_torch.gdn_combine_scan_torch`` (token loop, fp32) the Triton
kernels are tested against.
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from ..config import DEFAULT_KERNELS
from .combine_scan_plan import (
    Body,
    ChainLink,
    ChainTables,
    Piece,
    WYSteps,
    chain_tables,
    choose_chunk_size,
    merge_steps,
    plan_steps,
    tables_from_host,
)
from .combine_scan_torch import gdn_combine_scan_torch, wy_factors_torch

__all__ = [
    "MAX_TOKENS",
    "Body",
    "ChainLink",
    "ChainTables",
    "Piece",
    "WYSteps",
    "chain_tables",
    "choose_chunk_size",
    "gdn_combine_scan",
    "gdn_combine_scan_merged",
    "gdn_combine_scan_torch",
    "merge_steps",
    "plan_steps",
    "tables_from_host",
    "wy_factors_torch",
]

MAX_TOKENS = 2048  # above this many active tokens the chunked (WY) path is faster


def gdn_combine_scan(
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
    backend: str = "auto",
    tables: tuple[ChainTables, int] | None = None,
    precise_for_half: bool = DEFAULT_KERNELS.precise_for_half,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One linear layer's combine (see module doc). Shapes as ``gdn_combine_scan_torch``.

    ``backend``: ``"torch"`` (the token-loop twin), ``"fla"`` or ``"auto"`` (on CUDA the Triton WY scan,
    ``combine_scan_triton``: chunk factors in parallel, then a chain of chunk and body steps).
    ``precise_for_half``: the WY chain's state dots at about fp32 for bf16 / fp16 outputs too
    (``KernelConfig.precise_for_half``; fp32 outputs always are).
    ``tables``: prebuilt ``(ChainTables, row)`` for this chain (saves a host->device copy per layer);
    with tables the Triton kernel reads the chain from them and ``chain`` may be empty (it is only
    validated and used when the torch twin runs)."""
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    if q.shape != k.shape or v.shape[0] != T or HV % H or h0.shape != (HV, K, V):
        raise ValueError(
            f"need q, k [T, H, K], v [T, HV, V] with HV % H == 0 and h0 [HV, K, V]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}, h0 {tuple(h0.shape)}"
        )
    for link in chain:
        if isinstance(link, Piece) and not 0 <= link.start <= link.end <= T:
            raise ValueError(f"piece [{link.start}, {link.end}) outside the {T} active tokens")
        if isinstance(link, Body) and (link.T.shape != (HV, K, K) or link.S.shape != (HV, K, V)):
            raise ValueError(
                f"body pair must be T [HV, K, K], S [HV, K, V]; got {tuple(link.T.shape)}, {tuple(link.S.shape)}"
            )
    if resolve_triton(backend, q.device):
        from .combine_scan_triton import wy_chain_triton, wy_factors_triton

        tab, row = tables if tables is not None else (chain_tables([chain], q.device), 0)
        steps = tab.wy_steps()
        factors = wy_factors_triton(q, k, v, g, beta, steps.chunks, steps.chunk_size, use_qk_l2norm=use_qk_l2norm,
                                    scale=scale)  # fmt: skip
        return wy_chain_triton(
            factors, steps.meta, steps.ptrs[row], h0, v.dtype, steps.chunk_size, pair_dtype=tab.pair_dtype,
            transition=transition, precise=precise_for_half or v.dtype not in (torch.bfloat16, torch.float16),
            bounds=steps.bounds,
        )  # fmt: skip
    return gdn_combine_scan_torch(
        q, k, v, g, beta, chain, h0, use_qk_l2norm=use_qk_l2norm, scale=scale, transition=transition
    )


def gdn_combine_scan_merged(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    steps: WYSteps,
    row: int,
    h0: torch.Tensor,
    *,
    pair_dtype: torch.dtype,
    use_qk_l2norm: bool = True,
    transition: bool = True,
    precise_for_half: bool = DEFAULT_KERNELS.precise_for_half,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``row`` of N requests' combines in one launch each of the factor and chain kernels (CUDA):
    q, k ``[T, H, K]``, v ``[T, HV, V]``, g, beta ``[T, HV]`` the packed active rows of all of them,
    ``steps`` their merged plan (``merge_steps``), h0 ``[N, HV, K, V]`` -> (o ``[T, HV, V]``, final
    states ``[N, HV, K, V]`` fp32). Each request's result is what ``gdn_combine_scan`` gives it alone
    (the twin: ``gdn_combine_scan_torch`` per request, on its rows)."""
    from .combine_scan_triton import wy_chain_triton, wy_factors_triton

    factors = wy_factors_triton(q, k, v, g, beta, steps.chunks, steps.chunk_size, use_qk_l2norm=use_qk_l2norm)
    return wy_chain_triton(
        factors, steps.meta, steps.ptrs[row], h0, v.dtype, steps.chunk_size, pair_dtype=pair_dtype,
        transition=transition, precise=precise_for_half or v.dtype not in (torch.bfloat16, torch.float16),
        bounds=steps.bounds,
    )  # fmt: skip
