"""Combine scan in WY form: the host step plan and the torch twin of the chunk factors (the kernels:
``combine_scan_wy_triton``; the dispatch: ``combine_scan.gdn_combine_scan``).

A layer's chain (pieces of active tokens and cached bodies, ``combine_scan``) becomes a list of
*steps* for ``combine_scan_wy_triton``: each step is one chunk of at most ``chunk_size`` tokens of a
piece (or none) followed by one body (or none). The chunks' factors do not depend on the running
state and are computed for all chunks at once; only the steps are sequential. The plan is built on
the host from the chain tables' host copies, once per request for all linear layers.

``wy_factors_torch`` is the plain-PyTorch twin of ``_wy_factors_kernel`` (via ``gdn_torch``'s chunk
factors); the whole scan's twin is ``combine_scan.gdn_combine_scan_torch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .backend import to_device_async
from .gdn import gdn_torch

# Chunk sizes the planner picks from: the time of one chain step of that size and the latency of
# the factor kernel for it (us, H200, Qwen3.5 shape, 2026-12-01: a 64-token step runs bigger dots than
# a 16-token one and its factors solve a 64 x 64 triangular system row by row; an 8-token seam window
# pads to either).
STEP_US = {16: 10.0, 64: 20.0}
FACTOR_US = {16: 25.0, 64: 120.0}


@dataclass
class WYSteps:
    """Launch tables: chunks ``[NC, 2]`` int32 (start, end) for the factors; meta ``[NS, 4]`` int32
    (chunk start, end, chunk index or -1, has a body) and ptrs ``[L, NS, 2]`` int64 (each step's body
    T, S pointers per layer, 0 without a body) for the chain; ``chunk_size`` the largest chunk;
    ``body_of``: per step the chain link whose pair it applies, or -1 (host)."""

    chunk_size: int
    chunks: torch.Tensor
    meta: torch.Tensor
    ptrs: torch.Tensor
    body_of: list[int] = field(default_factory=list)

    def step_pointers(self, ptrs: torch.Tensor) -> torch.Tensor:
        """The chain's host pointer table ``[L, n, 2]`` -> the steps' ``[L, NS, 2]`` (host), for
        rewriting ``ptrs`` when only the pairs change (same chain layout)."""
        out = torch.zeros(ptrs.shape[0], len(self.body_of), 2, dtype=torch.int64)
        has = [s for s, link in enumerate(self.body_of) if link >= 0]
        if has:
            out[:, has] = ptrs[:, [self.body_of[s] for s in has]]
        return out


def _chunks(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


def choose_chunk_size(piece_lens: list[int]) -> int:
    """The chunk size with the cheapest scan for pieces of these lengths (``STEP_US``, ``FACTOR_US``)."""

    def cost(size: int) -> float:
        return STEP_US[size] * sum(-(-n // size) for n in piece_lens) + FACTOR_US[size]

    return min(STEP_US, key=lambda size: (cost(size), size))


def plan_steps(
    meta: list[tuple[int, int, int]], ptrs: torch.Tensor, device: torch.device, chunk_size: int | None = None
) -> WYSteps:
    """``meta``: the chain's host rows (kind 0 = piece / 1 = body, start, end); ``ptrs [L, n, 2]`` the
    host pointer table (``ChainTables``) -> the steps on ``device``. ``chunk_size``: None picks one."""
    if chunk_size is None:
        chunk_size = choose_chunk_size([b - a for kind, a, b in meta if kind == 0 and b > a])
    chunks: list[tuple[int, int]] = []
    steps: list[list[int]] = []  # start, end, chunk index, has body
    body_of: list[int] = []  # per step: the link whose pair it applies, or -1
    for i, (kind, a, b) in enumerate(meta):
        if kind == 0:
            for c in _chunks(a, b, chunk_size):
                steps.append([c[0], c[1], len(chunks), 0])
                body_of.append(-1)
                chunks.append(c)
        elif steps and not steps[-1][3]:
            steps[-1][3] = 1
            body_of[-1] = i
        else:
            steps.append([0, 0, -1, 1])
            body_of.append(i)
    out = WYSteps(
        chunk_size,
        to_device_async(torch.tensor(chunks, dtype=torch.int32).reshape(-1, 2), device),
        to_device_async(torch.tensor(steps, dtype=torch.int32).reshape(-1, 4), device),
        torch.empty(0),
        body_of,
    )
    out.ptrs = to_device_async(out.step_pointers(ptrs), device)
    return out


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
    """Twin of ``combine_scan_wy_triton.wy_factors_triton`` (same arguments and outputs: w, kd, qp
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
