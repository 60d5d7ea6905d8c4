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
  into its pages and attends over each sequence's rows gathered from the pool (in a paged plan the
  one-token rows attend through the block table instead: ``plan.PagedRows``). A plan whose rows pass
  prefix boundaries (``plan.split``) runs the linear mixer in two parts, the state between them
  written into the pool's snapshot rows (attention needs no split: its K/V are the pages).
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
    rec = rec_pool.index_select(0, plan.slots)
    if plan.split is not None:
        o, conv_final, final = _split_mix(mixer, pool, j, inputs, plan, conv, rec)
    else:
        ops, conv_final = mixer.convolve(*inputs, plan.cu_seqlens, conv, **at(mixer, plan.positions))
        o, final = mixer.mix(ops, plan.cu_seqlens, rec)
    conv_pool.index_copy_(0, plan.slots, conv_final.to(conv_pool.dtype))
    rec_pool.index_copy_(0, plan.slots, final)
    return o, extra


def _split_mix(
    mixer: LinearMixer,
    pool: StatePool,
    j: int,
    inputs: tuple[torch.Tensor, ...],
    plan: ForwardPlan,
    conv: torch.Tensor,
    rec: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``linear_mix``'s extend path in two parts (``plan.LinearSplit``): every row up to its split,
    the split rows' states after that into their snapshot rows, then the split rows' rest from there.
    Returns (o ``[T, ...]`` in row order, conv finals ``[N, C, W-1]``, recurrent finals ``[N, ...]``)."""
    sp = plan.split
    assert sp is not None
    if sp.cut is not None:  # part 1 the first ``cut`` tokens, part 2 the rest: views, no gather
        first, rest = tuple(x[: sp.cut] for x in inputs), tuple(x[sp.cut :] for x in inputs)
        pos_first, pos_rest = plan.positions[: sp.cut], plan.positions[sp.cut :]
    else:
        first, rest = (
            tuple(x.index_select(0, sp.first) for x in inputs),
            tuple(x.index_select(0, sp.rest) for x in inputs),
        )
        pos_first, pos_rest = plan.positions.index_select(0, sp.first), plan.positions.index_select(0, sp.rest)
    ops, conv_mid = mixer.convolve(*first, sp.cu_first, conv, **at(mixer, pos_first))
    o_first, mid = mixer.mix(ops, sp.cu_first, rec)
    conv_at, rec_at = conv_mid.index_select(0, sp.split_rows), mid.index_select(0, sp.split_rows)
    pool.snap_conv[j].index_copy_(0, sp.snapshots, conv_at.to(pool.snap_conv.dtype))
    pool.snap_recurrent[j].index_copy_(0, sp.snapshots, rec_at.to(pool.snap_recurrent.dtype))
    conv_at = conv_at.to(conv.dtype)  # as a prefill stopped at the boundary would resume: from the pool's dtype
    ops, conv_end = mixer.convolve(*rest, sp.cu_rest, conv_at, **at(mixer, pos_rest))
    o_rest, end = mixer.mix(ops, sp.cu_rest, rec_at)
    if sp.cut is not None:
        o = torch.cat([o_first, o_rest])
    else:
        o = o_first.new_empty(plan.n_tokens, *o_first.shape[1:])
        o.index_copy_(0, sp.first, o_first)
        o.index_copy_(0, sp.rest, o_rest)
    return o, conv_mid.index_copy(0, sp.split_rows, conv_end), mid.index_copy(0, sp.split_rows, end)


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
    pr = plan.paged_rows
    if pr is None:
        return attn.attend(q, keys, values, plan.cu_host, plan.cu_keys_host), extra
    # one-token rows through the block table, the longer rows over their gathered keys (``PagedRows``)
    o_one = attn.paged_decode(
        q.index_select(0, pr.decode_tok),
        pool.k[j],
        pool.v[j],
        plan.block_table.index_select(0, pr.decode_seq),
        plan.context_lens.index_select(0, pr.decode_seq),
    )
    o_long = attn.attend(q.index_select(0, pr.extend_tok), keys, values, pr.cu_extend_host, plan.cu_keys_host)
    o = o_long.new_empty(q.shape[0], *o_long.shape[1:])
    o.index_copy_(0, pr.decode_tok, o_one.to(o.dtype))
    o.index_copy_(0, pr.extend_tok, o_long)
    return o, extra
