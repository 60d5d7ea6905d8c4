"""Combine, attention layers: the active tokens attend over the spliced K/V of the whole prompt.

Cached bodies' keys are rotated to their global positions (``spec.rerotate``; left at their local
positions otherwise), the recomputed active rows (seam windows, blend rows, the suffix) write their
fresh keys and values over them, and the active queries attend causally over all ``L`` rows. Served
through the scheduler the K/V is assembled in the request's own pool rows (``StateDestination``).
"""

from __future__ import annotations

import torch

from hypic_agent.runtime.hypic.entry import AttentionEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.hypic.splice import SpliceTables
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.runner.destination import StateDestination
from hypic_agent.runtime.state import AttentionLayerState


def combine_attention(
    attn: FullAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    li: int,
    spec: ModeSpec,
    splice: SpliceTables | None,
    into: StateDestination | None = None,
    rotated: bool = False,
) -> tuple[torch.Tensor, AttentionLayerState]:
    """Un-rotated q, k, v of the active tokens -> (o ``[T, Hq, D]`` before the output projection,
    state: K/V ``[L, Hkv, D]``); the bodies' keys and values by ``splice`` (None: from the entries).
    ``into``: the K/V is assembled in the request's pool rows where they are one run (``kv_buffers``).
    ``rotated``: q and k come rotated to ``lay.active_pos`` already (a ``CombineGroup`` rotates the
    active rows of all its requests at once)."""
    if not rotated:
        q = attn.rotate(q, lay.active_pos)
        k = attn.rotate(k, lay.active_pos)
    if into is not None:
        k_full, v_full = into.kv_buffers(li, attn.k_row, attn.v_row, k)
    else:  # MLA: rope keys and latents (rotation: rope dims only)
        k_full, v_full = k.new_empty(lay.total, *attn.k_row), v.new_empty(lay.total, *attn.v_row)
    rot_pos = lay.body_pos if spec.rerotate else lay.body_local_pos
    if lay.body_segments and splice is not None:
        k_full[lay.body_pos] = attn.rotate(splice.bodies(li, v_full), rot_pos)
    elif lay.body_segments:
        bk, bv = [], []
        for s, n_body in zip(lay.body_segments, lay.body_lens, strict=True):
            e = entries[s]
            assert e is not None
            ae: AttentionEntry = e.layers[li]  # type: ignore[assignment]
            bk.append(ae.k[-n_body:])
            bv.append(ae.v[-n_body:])
        k_full[lay.body_pos] = attn.rotate(torch.cat(bk).to(k.dtype), rot_pos)
        v_full[lay.body_pos] = torch.cat(bv).to(v.dtype)
    k_full[lay.active_pos] = k  # after the bodies: blend rows inside them take their fresh keys / values
    v_full[lay.active_pos] = v
    cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32)  # host tensors: no device sync
    cu_k = torch.tensor([0, lay.total], dtype=torch.int32)
    o = attn.attend(
        q, k_full, v_full, cu_q, cu_k, q_positions=lay.active_pos, k_positions=lay.all_pos, keys_ascending=True
    )
    return o, AttentionLayerState(k_full, v_full)
