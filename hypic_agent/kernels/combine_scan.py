"""Combine scan: one linear layer of a HYPIC combine in one pass over its chain.

The chain of a composed prompt alternates *pieces* (active tokens, recomputed in context) and
cached *bodies* (transition pairs). Starting from ``h0`` the running state ``h [HV, K, V]``

* runs the gated delta rule token by token through a piece, emitting each token's output, and
* jumps over a body with its pair: ``h <- T @ h + S`` (``h <- h + S`` for the ``addition`` ablation).

This is what ``pieces' own pairs -> chain_scan -> forward from entering states`` computes in three
passes; fused, it is one launch per layer with no stacking of the cached pairs (the Triton kernel
reads them through a pointer table). It pays off when the active tokens are few (seam windows and a
question: a few hundred tokens); long pieces go through the chunked path instead (``MAX_TOKENS``).

``gdn_combine_scan_torch`` is the plain-PyTorch twin (token loop, fp32) the Triton kernel is
tested against; ``gdn_combine_scan`` dispatches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .backend import on_device, resolve_triton, to_device_async
from .combine_scan_wy import WYSteps, plan_steps
from .config import DEFAULT_KERNELS
from .gdn import gdn_torch

MAX_TOKENS = 2048  # above this many active tokens the chunked (WY) path is faster


@dataclass(frozen=True)
class Piece:
    """Active tokens ``[start, end)`` of the packed active sequence."""

    start: int
    end: int


@dataclass(frozen=True)
class Body:
    """A cached body's pair: T ``[HV, K, K]``, S ``[HV, K, V]`` (fp32 or bf16)."""

    T: torch.Tensor
    S: torch.Tensor


ChainLink = Piece | Body


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


@dataclass
class ChainTables:
    """Launch tables of the Triton kernels for the chains of several layers that share one layout:
    meta ``[n, 3]`` int32 (kind 0 = piece / 1 = body, start, end) and pointers ``[L, n, 2]`` int64
    (data pointers of each body's T and S per layer; 0 for pieces). Built on the host, copied once.
    ``meta_host`` / ``ptrs_host``: the host copies, for ``wy_steps`` (the WY scan's step plan)."""

    meta: torch.Tensor
    ptrs: torch.Tensor
    pair_dtype: torch.dtype
    meta_host: list[tuple[int, int, int]] = field(default_factory=list)
    ptrs_host: torch.Tensor | None = None
    _steps: WYSteps | None = field(default=None, repr=False)

    def wy_steps(self) -> WYSteps:
        """The WY scan's step tables for every layer of these tables (``combine_scan_wy.plan_steps``),
        built on first use."""
        if self._steps is None:
            assert self.ptrs_host is not None
            self._steps = plan_steps(self.meta_host, self.ptrs_host, self.meta.device)
        return self._steps


def tables_from_host(
    meta: list[tuple[int, int, int]], ptrs: torch.Tensor, dtype: torch.dtype, device: torch.device
) -> ChainTables:
    """Tables from the host rows ``meta`` (kind, start, end) and pointers ``[L, n, 2]`` int64, copied
    to ``device`` (the host copies stay with them)."""
    m = torch.tensor(meta, dtype=torch.int32).reshape(-1, 3)
    ptrs = ptrs.contiguous()
    return ChainTables(to_device_async(m, device), to_device_async(ptrs, device), dtype, list(meta), ptrs)


def chain_tables(chains: list[list[ChainLink]], device: torch.device) -> ChainTables:
    """Tables for ``chains`` (one per layer, same piece/body pattern; the pairs must stay alive
    while the tables are in use)."""
    if not chains:
        raise ValueError("need at least one chain")
    meta = [(0, c.start, c.end) if isinstance(c, Piece) else (1, 0, 0) for c in chains[0]]
    ptrs: list[tuple[int, int]] = []
    dtype: torch.dtype | None = None
    for chain in chains:
        if len(chain) != len(meta):
            raise ValueError("all chains of one table must have the same pattern")
        for c in chain:
            if isinstance(c, Piece):
                ptrs.append((0, 0))
                continue
            dtype = dtype or c.T.dtype
            if c.T.dtype != dtype or c.S.dtype != dtype or not (c.T.is_contiguous() and c.S.is_contiguous()):
                raise ValueError("combine scan needs contiguous pairs of one dtype")
            if not (on_device(c.T, device) and on_device(c.S, device)):
                raise ValueError(f"pairs must be on {device}")
            ptrs.append((c.T.data_ptr(), c.S.data_ptr()))
    p = torch.tensor(ptrs, dtype=torch.int64).reshape(len(chains), -1, 2)
    return tables_from_host(meta, p, dtype or torch.float32, device)


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
    ``combine_scan_wy_triton``: chunk factors in parallel, then a chain of chunk and body steps).
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
        from .combine_scan_wy_triton import wy_chain_triton, wy_factors_triton

        tab, row = tables if tables is not None else (chain_tables([chain], q.device), 0)
        steps = tab.wy_steps()
        factors = wy_factors_triton(q, k, v, g, beta, steps.chunks, steps.chunk_size, use_qk_l2norm=use_qk_l2norm,
                                    scale=scale)  # fmt: skip
        return wy_chain_triton(
            factors, steps.meta, steps.ptrs[row], h0, v.dtype, steps.chunk_size, pair_dtype=tab.pair_dtype,
            transition=transition, precise=precise_for_half or v.dtype not in (torch.bfloat16, torch.float16),
        )  # fmt: skip
    return gdn_combine_scan_torch(
        q, k, v, g, beta, chain, h0, use_qk_l2norm=use_qk_l2norm, scale=scale, transition=transition
    )
