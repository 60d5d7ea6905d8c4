"""fla-core twin of ``decay_attention_torch`` (CUDA only; imported lazily by ``kernels.decay_attention``).

fla's ``chunk_simple_gla`` runs the same recurrence, ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``,
``o_t = scale q_t^T S_t`` with a scalar log-decay per head ``g [B, T, H]``, over ``[B=1, T, H, K]``
with int64 ``cu_seqlens`` (``as_int64``: one object across layers, so fla's chunk-index cache hits).
Conventions mapped here:

* heads: fla reads q, k and v with one head index, so the G groups of q and k are expanded to the
  H value heads (head h reads group ``h // (H / G)``, as the reference); Lightning and Ring-linear
  have G = H (no copy);
* ``scale=1``: Mamba2's ``y = C S``, Lightning's ``o = q S`` and Ring-linear's pre-scaled q take no
  query scale (fla's default would be ``K^-0.5``);
* ``recurrent=True``: ``fused_recurrent_simple_gla``, token by token, for short sequences (a combine's
  seams and question) and with no host read of ``cu_seqlens`` (``chunk_simple_gla`` derives its chunk
  tables from it on the host), so a CUDA graph can capture it;
* dtypes: the dots run in q's dtype where it is bf16 / fp16 (v cast to it: Mamba2's ``v = dt x``
  arrives in fp32), else in fp32 (TF32 dots); g stays fp32; initial and final states are fp32 (fla
  keeps the per-chunk states behind the outputs in the compute dtype).
"""

from __future__ import annotations

import torch
from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

from .._varlen import as_int64, seq_ids


def _heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k ``[T, G, K]``, v ``[T, H, V]`` -> q, k ``[T, H, K]`` and v in the compute dtype."""
    dt = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.float32
    r = v.shape[1] // q.shape[1]
    qh, kh = q.to(dt), k.to(dt)
    if r > 1:
        qh, kh = qh.repeat_interleave(r, dim=1), kh.repeat_interleave(r, dim=1)
    return qh, kh, v.to(dt)


def _run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    recurrent: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    qh, kh, vh = _heads(q, k, v)
    run = fused_recurrent_simple_gla if recurrent else chunk_simple_gla
    o, final = run(
        qh[None], kh[None], vh[None], g=g.float()[None], scale=1.0,
        initial_state=None if initial_state is None else initial_state.float().contiguous(),
        output_final_state=True, cu_seqlens=as_int64(cu_seqlens),
    )  # fmt: skip
    return o[0], final.float()


def decay_attention_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    recurrent: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, G, K]``, v ``[T, H, V]``, g ``[T, H]`` (log-decay), cu_seqlens ``[N+1]``,
    initial_state ``[N, H, K, V]`` or None (zeros) -> (o ``[T, H, V]`` in the compute dtype, finals
    ``[N, H, K, V]`` fp32)."""
    return _run(q, k, v, g, cu_seqlens, initial_state, recurrent)


def decay_pairs_fla(
    k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, cu_seqlens: torch.Tensor, recurrent: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pair from a zero state: k ``[T, G, K]``, v ``[T, H, V]``, g ``[T, H]``,
    cu_seqlens ``[N+1]`` -> (T ``[N, H]`` = exp(sum g), S ``[N, H, K, V]``), fp32. S is fla's final
    state from zeros (the pass's outputs are not used: q = k); the sums of g are one scatter-add per
    token (no host reads)."""
    _, S = _run(k, k, v, g, cu_seqlens, None, recurrent)
    n, total = cu_seqlens.numel() - 1, g.shape[0]
    sums = g.new_zeros(n, g.shape[1], dtype=torch.float32)
    sums.index_add_(0, seq_ids(cu_seqlens, total), g.float())
    return sums.exp(), S
