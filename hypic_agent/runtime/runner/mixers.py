"""The mixers' work inside the runner's layer loop, on pooled state (``StatePool``).

Each mixer kind has two paths over a ``ForwardPlan``:

* decode (every sequence one token): the linear layer's conv and recurrence step update the
  request's slot in place (``LinearMixer.decode_slots``: GDN's Triton kernel on CUDA, the other
  kinds' torch steps); attention writes the token's K/V into its page and attends over the
  pages through the block table (MLA: the token's rope key and latent, attended in the absorbed
  form). Static shapes throughout, so a decode step can be replayed from a CUDA graph
  (``decode_graphs.py``);
* extend (prefill chunks, or decode rows mixed with them): the varlen conv and the chunked
  recurrence start from the slots' states and write the final states back; attention writes the chunk's K/V
  into its pages and attends over each sequence's rows gathered from the pool.
"""

from __future__ import annotations

import torch

from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.linear_mixer import LinearMixer, at
from hypic_agent.runtime.runner.plan import ForwardPlan
from hypic_agent.runtime.runner.pool import StatePool


def linear_mix(
    mixer: LinearMixer, pool: StatePool, li: int, inputs: tuple[torch.Tensor, ...], plan: ForwardPlan
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The linear mixer's ``inputs`` of the plan's rows -> (o, ``inputs[1:2]`` for the output stage:
    GDN o ``[T, HV, V]`` and ``(z,)``); the slots' recurrent and conv states advance in place."""
    j = pool.index[li]
    conv_pool, rec_pool = pool.conv[j], pool.recurrent[j]
    extra = tuple(inputs[1:2])
    if plan.decode_only:
        return mixer.decode_slots(inputs, conv_pool, rec_pool, plan.slots, **at(mixer, plan.positions)), extra
    conv = conv_pool.index_select(0, plan.slots)
    ops, conv_final = mixer.convolve(*inputs, plan.cu_seqlens, conv, **at(mixer, plan.positions))
    o, final = mixer.mix(ops, plan.cu_seqlens, rec_pool.index_select(0, plan.slots))
    conv_pool.index_copy_(0, plan.slots, conv_final.to(conv_pool.dtype))
    rec_pool.index_copy_(0, plan.slots, final)
    return o, extra


def attention_mix(
    attn: FullAttention, pool: StatePool, li: int, inputs: tuple[torch.Tensor, ...], plan: ForwardPlan
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``FullAttention.qkv`` of the plan's rows -> (o ``[T, Hq, D]``, ``(gate,)`` or ``()``); the rows'
    rotated K/V are written into their pages first."""
    q, k, v = inputs[:3]
    extra = tuple(inputs[3:])
    j = pool.index[li]
    q, k = attn.rotate(q, plan.positions), attn.rotate(k, plan.positions)
    k_rows = pool.k[j].view(-1, *pool.k.shape[3:])
    v_rows = pool.v[j].view(-1, *pool.v.shape[3:])
    k_rows.index_copy_(0, plan.rows, k.to(k_rows.dtype))
    v_rows.index_copy_(0, plan.rows, v.to(v_rows.dtype))
    if plan.decode_only and plan.key_rows.numel() == 0:  # a paged plan (``plan_forward(paged=True)``)
        # the paged kernel; MLA's latent pages: its absorbed torch path (``MLAttention.paged_decode``)
        return attn.paged_decode(q, pool.k[j], pool.v[j], plan.block_table, plan.context_lens), extra
    keys = k_rows.index_select(0, plan.key_rows)
    values = v_rows.index_select(0, plan.key_rows)
    return attn.attend(q, keys, values, plan.cu_host, plan.cu_keys_host), extra
