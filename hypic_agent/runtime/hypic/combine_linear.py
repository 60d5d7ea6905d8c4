"""Combine, linear layers: the running state advances piece -> cached body pair -> next piece.

Each piece's conv state is preloaded with the tail of the body before it. Two ways to run it,
same result (see ``combine``'s module doc): the fused scan (``GatedDeltaNet.mix_scan`` over the
layer's chain) or the chunked path (each piece's own pair from one varlen pass, ``compose`` for the
states entering the pieces, the outputs from those states). A linear mixer with RoPE inside
(Ring-linear's ``lightning_rope``) gets its cached states placed at their segment's offset.
"""

from __future__ import annotations

import torch

from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.hypic.blend_rows import blend_linear
from hypic_agent.runtime.hypic.combine_inputs import LayerScan
from hypic_agent.runtime.hypic.entry import LinearEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.layers.gated_deltanet import GatedDeltaNet
from hypic_agent.runtime.models.layers.linear_mixer import LinearMixer, at
from hypic_agent.runtime.state import LinearLayerState


def _conv_init(
    mixer: LinearMixer,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    li: int,
    like: torch.Tensor,
    tails: torch.Tensor | None,
) -> torch.Tensor:
    """Conv state entering each piece ``[P, C, W-1]``: the tail of the body before it, or zeros;
    ``tails``: this layer's row of ``SpliceTables.conv_tails`` (None: stacked from the entries)."""
    if tails is not None:
        return tails.to(like.dtype)
    zero = like.new_zeros(mixer.conv_dim, mixer.kernel - 1)
    stacked = [
        zero if seg is None else entries[seg].layers[li].conv_tail  # type: ignore[union-attr]
        for seg in lay.piece_conv_from
    ]
    return torch.stack(stacked).to(like.dtype)


def combine_linear(
    mixer: LinearMixer,
    inputs: tuple[torch.Tensor, ...],
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    li: int,
    spec: ModeSpec,
    scan: LayerScan | None,
    tails: torch.Tensor | None,
    h0: torch.Tensor | None,
    kernels: KernelConfig,
    record: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, LinearLayerState]:
    """``inputs``: the linear mixer's ``inputs`` of the active tokens; ``scan``: the layer's chain for
    the fused scan (GDN only; None: the chunked path); ``tails``: the conv states entering the pieces
    (None: from the entries); ``h0``: the composed leading bodies (None: zero); ``kernels``: the fused
    scan's kernel choices -> (o before the output projection (GDN ``[T, HV, V]``), state).

    With blend rows (``lay.blend_rows``) the pieces run here on their rows and ``blend.linear_rows``
    runs the blend rows from the states entering their bodies (``record``: where this call leaves
    the chain's states ``"states"`` and the pieces' final conv states ``"conv"``)."""
    if lay.blend_rows is not None and record is None:
        assert scan is None, "blend rows run on the chunked path"
        return blend_linear(mixer, inputs, lay, entries, li, spec, tails, kernels, combine_linear)
    dev = inputs[0].device
    init = _conv_init(mixer, lay, entries, li, inputs[0], tails)
    pos = lay.active_pos if lay.piece_rows is None else lay.active_pos[lay.piece_rows]
    ops, conv_final = mixer.convolve(*inputs, lay.cu_pieces, init, **at(mixer, pos))
    if record is not None:
        record["conv"] = conv_final
    if scan is not None:
        assert isinstance(mixer, GatedDeltaNet)
        o, final = mixer.mix_scan(
            ops, scan.chain, transition=spec.transition, tables=scan.tables, h0=h0,
            precise_for_half=kernels.precise_for_half,
        )  # fmt: skip
        return o, LinearLayerState(final, conv_final[-1])
    h0 = torch.zeros(mixer.hv, mixer.dk, mixer.dv, device=dev, dtype=torch.float32)
    if lay.cu_pieces.numel() == 2 and lay.chain[0].kind == "piece" and record is None:  # nothing cached before it
        o, finals = mixer.mix(ops, lay.cu_pieces, h0.unsqueeze(0))
        return o, LinearLayerState(finals[-1], conv_final[-1])

    place = getattr(mixer, "place", None) if spec.rerotate else None  # RoPE inside: S at its segment's offset
    starts = lay.segment_starts

    def enter(Tp: torch.Tensor, Sp: torch.Tensor) -> torch.Tensor:
        """Pieces' own pairs (GDN ``[P, HV, K, K]``, Mamba2 ``[P, HV]``; and ``[P, HV, K, V]``) -> states
        entering them ``[P, HV, K, V]``."""
        eye = mixer.pair_identity(h0)
        Ts: list[torch.Tensor] = []
        Ss: list[torch.Tensor] = []
        for item in lay.chain:
            if item.kind == "piece":
                Ts.append(Tp[item.index])
                Ss.append(Sp[item.index])
            else:
                le: LinearEntry = entries[item.index].layers[li]  # type: ignore[union-attr,assignment]
                Ts.append(le.T.float() if spec.transition else eye)
                Ss.append(le.S.float() if place is None else place(le.S.float(), starts[item.index]))
        states = mixer.compose(h0, torch.stack(Ts), torch.stack(Ss))  # [n+1, HV, K, V]
        if record is not None:
            record["states"] = states  # entering every chain item
        return states[lay.piece_slots]  # the states entering each piece

    o, finals = mixer.mix_after_pairs(ops, lay.cu_pieces, enter)
    return o, LinearLayerState(finals[-1], conv_final[-1])
