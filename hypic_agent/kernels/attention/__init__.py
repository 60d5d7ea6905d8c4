"""Varlen softmax attention with GQA and position-based causal masking.

Per sequence, query i sees key j iff ``k_pos[j] <= q_pos[i]``. Positions default to
"queries are the last tokens of their key sequence" (bottom-right causal): local key positions
``0..Lk-1`` and query positions ``Lk-Lq .. Lk-1``. A query that sees no key gets zeros.
GQA: query head h reads kv head ``h // (Hq // Hkv)`` (transformers' ``repeat_kv``).

On CUDA, a sequence with at most ``SPLITK_MAX_Q`` queries that are fewer than its keys (combine's
active tokens over the spliced prompt, prefix continuation, decode) runs the split-K Triton kernel
(``attention_triton``); everything else, and every CPU call, runs SDPA (the twin, ``attention_torch``).
"""

from __future__ import annotations

import torch

from .._varlen import normalize_cu_seqlens
from ..backend import resolve_triton
from .attention_torch import sdpa, sdpa_positions

__all__ = ["SPLITK_MAX_Q", "attention", "sdpa", "sdpa_positions"]

SPLITK_MAX_Q = 4096  # queries per sequence up to which CUDA runs the split-K kernel


def _splitk_usable(q: torch.Tensor, v: torch.Tensor, backend: str) -> bool:
    """The split-K kernel applies: CUDA with triton (``backend`` not ``"torch"``), fp16/bf16, head
    dims <= 256."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and max(q.shape[-1], v.shape[-1]) <= 256
        and resolve_triton(backend, q.device)
    )


def _bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[int]:
    """Sequence bounds as host ints. Pass cu_seqlens on the CPU where possible: reading them from
    the GPU waits for every queued kernel (a host sync per attention layer)."""
    return normalize_cu_seqlens(cu_seqlens, total, torch.device("cpu")).tolist()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    keys_ascending: bool = False,
) -> torch.Tensor:
    """Attention over N packed sequences.

    Args:
        q: ``[Tq, Hq, D]``; k: ``[Tk, Hkv, D]``; v: ``[Tk, Hkv, Dv]`` (Hq a multiple of Hkv).
        cu_seqlens_q, cu_seqlens_k: ``[N+1]`` int32 (None = one sequence); CPU tensors avoid a host sync.
        q_positions ``[Tq]``, k_positions ``[Tk]``: int positions (both or neither).
        scale: softmax scale, default ``D ** -0.5``.
        keys_ascending: ``k_positions`` ascend within each sequence (lets the split-K kernel count the
            key blocks it needs up front; a wrong promise gives wrong outputs). Implied without positions.
    Returns:
        ``[Tq, Hq, Dv]`` in q's dtype.
    """
    Tq, Hq, D = q.shape
    Tk, Hkv, _ = k.shape
    if Hq % Hkv or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"need Hq % Hkv == 0 and k, v [Tk, Hkv, ...]; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if (q_positions is None) != (k_positions is None):
        raise ValueError("pass both q_positions and k_positions, or neither")
    cq = _bounds(cu_seqlens_q, Tq)
    ck = _bounds(cu_seqlens_k, Tk)
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k describe {len(cq) - 1} vs {len(ck) - 1} sequences")
    scale = D**-0.5 if scale is None else scale
    splitk = _splitk_usable(q, v, backend)
    out = q.new_zeros(Tq, Hq, v.shape[-1])
    for i in range(len(cq) - 1):
        qa, qb, ka, kb = cq[i], cq[i + 1], ck[i], ck[i + 1]
        lq, lk = qb - qa, kb - ka
        if lq == 0 or lk == 0:
            continue
        qs, ks, vs = q[qa:qb].transpose(0, 1), k[ka:kb].transpose(0, 1), v[ka:kb].transpose(0, 1)
        if q_positions is None:
            if lq == lk:
                out[qa:qb] = sdpa(qs, ks, vs, None, True, scale).transpose(0, 1)
                continue
            qp = torch.arange(lk - lq, lk, device=q.device)
            kp = torch.arange(lk, device=q.device)
        else:
            assert k_positions is not None
            qp, kp = q_positions[qa:qb].to(q.device), k_positions[ka:kb].to(q.device)
        if splitk and lq <= SPLITK_MAX_Q and lq < lk:
            from .attention_triton import splitk_attention_triton

            out[qa:qb] = splitk_attention_triton(
                q[qa:qb], k[ka:kb], v[ka:kb], qp, kp, scale, keys_ascending=keys_ascending or q_positions is None
            )
            continue
        out[qa:qb] = sdpa_positions(qs, ks, vs, qp, kp, scale).transpose(0, 1)
    return out
