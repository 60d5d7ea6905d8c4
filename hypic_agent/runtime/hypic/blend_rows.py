"""Blend rows in a linear layer: scattered body tokens recomputed in a hybrid (``seam="blend"``).

A linear layer keeps one state per request, so a token inside a cached body has no state of its
own to be recomputed from: the body's pair ``(T_C, S(C|0))`` jumps over all its tokens at once.
What this does, per linear layer:

* **the chain is unchanged** (exact in the HYPIC sense): pieces and body pairs compose as without
  blend rows, so the state after every body, every piece's output and the request's final state
  are the same as for the layout without them. A blend token's own contribution to the state stays
  the cached (isolated) one inside its body's pair;
* **a blend token's output is approximate**: the blend rows of one body run as one short sequence
  from the state entering that body (exact: everything before the body, its seam included) and
  the conv state entering it, in order, i.e. as if they directly followed the seam. What this drops
  is the body tokens between the seam and each blend token (``T_{w..t}`` and ``S(w..t|0)`` of the
  exact ``S_t = T_{w..t} S_in + S(w..t|0)``), which no entry holds per position. For the first
  body tokens after the seam the dropped span is short; for a deep token the layer sees the
  context before its segment but little of its own.

Attention layers need nothing here: the blend rows' fresh keys / values overwrite the cached rows
(``combine_attention``). On an attention-only model blend rows are exact recomputation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hypic_agent.kernels.backend import to_device_async
from hypic_agent.runtime.hypic.entry import LinearEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.layers.linear_mixer import LinearMixer, at
from hypic_agent.runtime.state import LinearLayerState


def _conv_before(
    lay: CombineLayout, entries: list[SegmentEntry | None], li: int, k: int, conv: torch.Tensor
) -> torch.Tensor:
    """The conv state entering chain item ``k``: the final one of the piece before it, the tail of the
    body before it, or zeros."""
    if k == 0:
        return conv.new_zeros(conv.shape[1:])
    item = lay.chain[k - 1]
    if item.kind == "piece":
        return conv[item.index]
    le = entries[item.index].layers[li]  # type: ignore[union-attr]
    assert isinstance(le, LinearEntry)
    return le.conv_tail.to(conv.dtype)


def blend_linear(
    mixer: LinearMixer,
    inputs: tuple[torch.Tensor, ...],
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    li: int,
    spec: ModeSpec,
    tails: torch.Tensor | None,
    kernels: Any,
    chunked: Callable[..., tuple[torch.Tensor, LinearLayerState]],
) -> tuple[torch.Tensor, LinearLayerState]:
    """``combine_linear.combine_linear`` for a layout with blend rows (see module doc): the pieces through
    ``chunked`` (``combine_linear.combine_linear`` on the piece rows), then the blend rows -> (o of every active
    row, the layer's state)."""
    assert lay.piece_rows is not None and lay.blend_rows is not None
    record: dict[str, torch.Tensor] = {}
    xp = tuple(x[lay.piece_rows] for x in inputs)
    o_p, st = chunked(mixer, xp, lay, entries, li, spec, None, tails, None, kernels, record)
    conv, groups = record["conv"], lay.blend_groups
    states = record.get("states")  # None: nothing recurrent (short_conv: the conv is the whole state)
    h0 = None if states is None else torch.stack([states[k] for k, _, _ in groups])  # [G, HV, K, V]
    c0 = torch.stack([_conv_before(lay, entries, li, k, conv) for k, _, _ in groups])
    xb = tuple(x[lay.blend_rows] for x in inputs)
    cu = to_device_async(torch.tensor([0, *(b for _, _, b in groups)], dtype=torch.int32), xb[0].device)
    ops, _ = mixer.convolve(*xb, cu, c0.to(xb[0].dtype), **at(mixer, lay.active_pos[lay.blend_rows]))
    o_b, _ = mixer.mix(ops, cu, h0)
    o = o_p.new_empty(inputs[0].shape[0], *o_p.shape[1:])
    o[lay.piece_rows] = o_p
    o[lay.blend_rows] = o_b.to(o_p.dtype)
    return o, st
