"""fla-core twins of ``kda_torch`` (CUDA only; imported lazily by ``kernels.kda``).

fla's KDA takes ``[B=1, T, H, K]`` with int64 ``cu_seqlens`` for packed sequences (``as_int64``: the
same object across layers, so fla's identity cache of chunk indices hits) and the same conventions
as the reference: q and k l2-normalised in the kernel (``use_qk_l2norm_in_kernel``, eps 1e-6 inside
the square root), q scaled by ``K^-0.5`` after the norm (``scale=None``), ``g`` the per-key-channel
log-decay ``[T, H, K]`` already computed by the mixer (``use_gate_in_kernel=False``: fla's own
``-exp(A_log) softplus`` gate is not used, so Kimi's and Ling's gates both pass through as they
are), ``beta`` after the sigmoid, states ``[N, H, K, V]`` fp32 (keys x values, ``state_v_first``
off). ``safe_gate`` stays off: Kimi's gate is unbounded below, and the general intra-chunk path is
exact for any gate.

``recurrent=True`` runs the same recurrence token by token (``fused_recurrent_kda`` over the packed
sequences): for short sequences (a combine's seams and question), and with no host read of
``cu_seqlens`` (the chunked kernels derive their chunk tables from it on the host), so a CUDA graph
can capture it.
"""

from __future__ import annotations

import torch
from fla.ops.kda import chunk_kda, fused_recurrent_kda
from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

from .._varlen import as_int64


def kda_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    recurrent: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``[T, H, K]``, v ``[T, H, V]``, g ``[T, H, K]``, beta ``[T, H]``, cu_seqlens ``[N+1]``,
    initial_state ``[N, H, K, V]`` or None (zeros) -> (o ``[T, H, V]`` in q's dtype, finals
    ``[N, H, K, V]`` fp32). g stays fp32 (a bf16 log-decay would round the cumulative decay)."""
    if recurrent:
        o, final = fused_recurrent_kda(
            q[None], k[None], v[None], g.float()[None], beta.to(q.dtype)[None],
            initial_state=None if initial_state is None else initial_state.float().contiguous(),
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=as_int64(cu_seqlens),
        )  # fmt: skip
        return o[0], final.float()
    o, final = chunk_kda(
        q[None], k[None], v[None], g.float()[None], beta.to(q.dtype)[None],
        initial_state=None if initial_state is None else initial_state.float().contiguous(),
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=as_int64(cu_seqlens),
    )  # fmt: skip
    return o[0], final


def kda_pairs_fla(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    recurrent: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pair from one ``chunk_kda`` pass: values ``[v | 0]`` ``[T, H, V+K]`` from the
    initial state ``[0 | I]``. The recurrence is linear and acts on each value column alone, so the
    final state's first V columns are ``S`` (from zero, with v) and the last K are ``T @ I = T`` (from
    the identity, with zero values): the reference's two runs in one. Inputs are promoted to fp32 so
    that the stored pair does not inherit bf16 intra-chunk factors (fla's dots then run in TF32).
    -> (T ``[N, H, K, K]``, S ``[N, H, K, V]``) fp32. The outputs of the pass are not used (q = k).
    ``recurrent``: the pass token by token (``fused_recurrent_kda``; see the module's docstring)."""
    n, (t, h, kd), vd = cu_seqlens.numel() - 1, k.shape, v.shape[-1]
    kf = k.float()
    v_ext = torch.cat([v.float(), kf.new_zeros(t, h, kd)], dim=-1)
    h0 = kf.new_zeros(n, h, kd, vd + kd)
    h0[..., vd:] = torch.eye(kd, device=k.device, dtype=torch.float32)
    run = fused_recurrent_kda if recurrent else chunk_kda
    _, final = run(
        kf[None], kf[None], v_ext[None], g.float()[None], beta.float()[None], scale=1.0, initial_state=h0,
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=as_int64(cu_seqlens),
    )  # fmt: skip
    final = final.float()
    return final[..., vd:].contiguous(), final[..., :vd].contiguous()


def kda_step_fla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence (B = N, T = 1): q, k ``[N, H, K]``, v ``[N, H, V]``, g ``[N, H, K]``,
    beta ``[N, H]``, state ``[N, H, K, V]`` -> (o ``[N, H, V]`` in q's dtype, new state fp32; the input
    state is not modified)."""
    o, new = fused_recurrent_kda(
        q[:, None], k[:, None], v[:, None], g.float()[:, None], beta.to(q.dtype)[:, None],
        initial_state=state.float().contiguous(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return o[:, 0], new


def kda_decode_slots_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token per row against its pool slot, in place: fla's continuous-batching recurrence (the
    kernel vLLM's KDA decode uses) reads ``state_pool[slots[i]]`` and writes the new state back there
    (``ssm_state_indices``, ``inplace_final_state``): one launch, no gather / scatter of the
    ``[N, H, K, V]`` states, no host reads (CUDA-graph capturable). Rows sharing a slot (the decode
    graphs' padding rows all use the scratch slot) race on it; their outputs are not used.
    q, k ``[N, H, K]``, v ``[N, H, V]``, g ``[N, H, K]``, beta ``[N, H]``, state_pool ``[S, H, K, V]``
    fp32 with contiguous slots, slots ``[N]`` int -> o ``[N, H, V]`` in q's dtype."""
    o, _ = fused_recurrent_kda_fwd(
        q=q[:, None].contiguous(), k=k[:, None].contiguous(), v=v[:, None].contiguous(),
        g=g.float()[:, None].contiguous(), beta=beta.to(q.dtype)[:, None].contiguous(), initial_state=state_pool,
        inplace_final_state=True, ssm_state_indices=slots, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return o[:, 0]
