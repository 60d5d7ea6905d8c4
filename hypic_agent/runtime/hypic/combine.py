"""Combine: one forward over the active tokens only (seam windows + suffix) on top of cached entries.

Linear layers: the running state advances piece -> cached body pair -> next piece; each piece's
conv state is preloaded with the tail of the body before it. Two ways to run it, same result:

* fused (``kernels.combine_scan``, default on CUDA when the active tokens are few): one launch per
  layer walks the chain, token steps through pieces and ``T @ h + S`` over bodies, reading the
  cached pairs through a pointer table built once per request. The bodies at the head of a
  ``w = 0`` prompt are composed for all layers before the forward, in one launch
  (``chain.compose_body_pointers``), and each layer's scan starts from that state;
* chunked: each piece's own pair (from a zero state) comes out of one varlen pass, one
  ``chain_scan`` gives the state entering every piece, and the pieces' outputs follow from those
  states with the same WY factors (``GatedDeltaNet.mix_after_pairs``).

Attention layers: active tokens attend over spliced KV (cached bodies rotated to their global
positions, or left at their local positions without ``rerotate``) and write fresh KV for the
active rows. Feed-forward blocks replay from CUDA graphs where enabled (``runtime.graphs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.kernels import chain as chain_ops
from hypic_agent.kernels import combine_scan
from hypic_agent.kernels.backend import resolve_triton, same_device
from hypic_agent.runtime.graphs import mixer_in, mixer_out
from hypic_agent.runtime.hypic.build import ColdBatch
from hypic_agent.runtime.hypic.entry import AttentionEntry, LinearEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.runtime.models.attention import FullAttention
from hypic_agent.runtime.models.gated_deltanet import GatedDeltaNet
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.state import AttentionLayerState, LayerState, LinearLayerState, RequestState


def _conv_init(
    mixer: GatedDeltaNet, lay: CombineLayout, entries: list[SegmentEntry | None], li: int, like: torch.Tensor
) -> torch.Tensor:
    """Conv state entering each piece ``[P, C, W-1]``: the tail of the body before it, or zeros."""
    zero = like.new_zeros(mixer.conv_dim, mixer.kernel - 1)
    tails = [
        zero if seg is None else entries[seg].layers[li].conv_tail  # type: ignore[union-attr]
        for seg in lay.piece_conv_from
    ]
    return torch.stack(tails).to(like.dtype)


def _chain(lay: CombineLayout, entries: list[SegmentEntry | None], li: int) -> list[combine_scan.ChainLink]:
    """Layer ``li``'s chain in prompt order: pieces (active token ranges) and cached body pairs."""
    out: list[combine_scan.ChainLink] = []
    for item in lay.chain:
        if item.kind == "piece":
            out.append(combine_scan.Piece(lay.cu_host[item.index], lay.cu_host[item.index + 1]))
        else:
            le: LinearEntry = entries[item.index].layers[li]  # type: ignore[union-attr,assignment]
            out.append(combine_scan.Body(le.T, le.S))
    return out


# Compose the bodies at the head of the prompt for all layers before the forward (see ``_scan_plan``);
# False runs them inside each layer's scan (kept for A/B measurements).
PRECOMPOSE_LEADING_BODIES = True


@dataclass
class _LayerScan:
    """A linear layer's chain for the fused scan (read by the torch twin; empty with tables), its
    row of the Triton launch tables (None: the twin), and the state entering the chain (None: zero;
    else the composed bodies at the head of the prompt, which the chain then leaves out)."""

    chain: list[combine_scan.ChainLink]
    tables: tuple[combine_scan.ChainTables, int] | None = None
    h0: torch.Tensor | None = None


def _linear(
    mixer: GatedDeltaNet,
    inputs: tuple[torch.Tensor, ...],
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    li: int,
    spec: ModeSpec,
    scan: _LayerScan | None,
) -> tuple[torch.Tensor, LinearLayerState]:
    """``inputs``: ``GatedDeltaNet.inputs`` of the active tokens; ``scan``: the layer's chain for the
    fused scan (None: the chunked path) -> (o ``[T, HV, V]`` before the output projection, state)."""
    mixed, z, g, beta = inputs
    dev = mixed.device
    ops, conv_final = mixer.convolve(mixed, z, g, beta, lay.cu_pieces, _conv_init(mixer, lay, entries, li, mixed))
    if scan is not None:
        o, final = mixer.mix_scan(ops, scan.chain, transition=spec.transition, tables=scan.tables, h0=scan.h0)
        return o, LinearLayerState(final, conv_final[-1])
    hv, kd, vd = mixer.hv, mixer.dk, mixer.dv
    h0 = torch.zeros(hv, kd, vd, device=dev, dtype=torch.float32)
    if lay.cu_pieces.numel() == 2 and lay.chain[0].kind == "piece":  # nothing cached before the only piece
        o, finals = mixer.mix(ops, lay.cu_pieces, h0.unsqueeze(0))
        return o, LinearLayerState(finals[-1], conv_final[-1])

    def enter(Tp: torch.Tensor, Sp: torch.Tensor) -> torch.Tensor:
        """Pieces' own pairs ``[P, HV, K, K]`` / ``[P, HV, K, V]`` -> states entering them ``[P, HV, K, V]``."""
        eye = torch.eye(kd, device=dev, dtype=torch.float32).expand(hv, kd, kd)
        Ts: list[torch.Tensor] = []
        Ss: list[torch.Tensor] = []
        piece_slot: list[int] = []
        for item in lay.chain:
            if item.kind == "piece":
                piece_slot.append(len(Ts))
                Ts.append(Tp[item.index])
                Ss.append(Sp[item.index])
            else:
                le: LinearEntry = entries[item.index].layers[li]  # type: ignore[union-attr,assignment]
                Ts.append(le.T.float() if spec.transition else eye)
                Ss.append(le.S.float())
        states = chain_ops.chain_scan(h0, torch.stack(Ts), torch.stack(Ss), backend=mixer.backend)  # [n+1, HV, K, V]
        return states[torch.tensor(piece_slot, device=dev)]

    o, finals = mixer.mix_after_pairs(ops, lay.cu_pieces, enter)
    return o, LinearLayerState(finals[-1], conv_final[-1])


def _attention(
    attn: FullAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    li: int,
    spec: ModeSpec,
) -> tuple[torch.Tensor, AttentionLayerState]:
    """Un-rotated q, k, v of the active tokens -> (o ``[T, Hq, D]`` before the output projection, state)."""
    q = attn.rotate(q, lay.active_pos)
    k = attn.rotate(k, lay.active_pos)
    k_full = k.new_empty(lay.total, attn.hkv, attn.d)
    v_full = v.new_empty(lay.total, attn.hkv, attn.d)
    k_full[lay.active_pos] = k
    v_full[lay.active_pos] = v
    if lay.body_segments:
        bk, bv = [], []
        for s, n_body in zip(lay.body_segments, lay.body_lens, strict=True):
            e = entries[s]
            assert e is not None
            ae: AttentionEntry = e.layers[li]  # type: ignore[assignment]
            bk.append(ae.k[-n_body:])
            bv.append(ae.v[-n_body:])
        rot_pos = lay.body_pos if spec.rerotate else lay.body_local_pos
        k_full[lay.body_pos] = attn.rotate(torch.cat(bk).to(k.dtype), rot_pos)
        v_full[lay.body_pos] = torch.cat(bv).to(v.dtype)
    cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32)  # host tensors: no device sync
    cu_k = torch.tensor([0, lay.total], dtype=torch.int32)
    k_pos = lay.all_pos
    o = attn.attend(q, k_full, v_full, cu_q, cu_k, q_positions=lay.active_pos, k_positions=k_pos)
    return o, AttentionLayerState(k_full, v_full)


def _scan_plan(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    fused_scan: bool | None,
    transition: bool,
    cold: ColdBatch | None = None,
) -> dict[int, _LayerScan | None]:
    """Per linear layer: its fused-scan chain, or None for the chunked path. ``fused_scan=None``
    picks the fused Triton scan on CUDA when the active tokens are at most ``combine_scan.MAX_TOKENS``.

    Bodies at the head of the prompt (a ``w = 0`` request: every cached segment is all body) do not
    depend on the forward: all layers' chains of them are composed before it in one launch
    (``chain.compose_body_pointers``; the torch twin ``chain.compose_bodies``), and each layer's scan
    starts from its composed state. The run stops at the first piece and at the first segment of
    ``cold`` (built inside this forward: its pairs exist only once its layer has run)."""
    lin = [i for i, layer in enumerate(model.layers) if layer.linear_attn is not None]
    if not lin or fused_scan is False:
        return dict.fromkeys(lin)
    dev = lay.active_ids.device
    mixer = model.layers[lin[0]].linear_attn
    assert mixer is not None
    triton = resolve_triton(mixer.backend, dev)
    if fused_scan is None and not (triton and lay.active_ids.numel() <= combine_scan.MAX_TOKENS):
        return dict.fromkeys(lin)
    building = {id(e) for e in cold.entries} if cold is not None else set()
    lead = next(
        (i for i, item in enumerate(lay.chain) if item.kind != "body" or id(entries[item.index]) in building),
        len(lay.chain),
    )
    lead = lead if PRECOMPOSE_LEADING_BODIES else 0
    if not triton:  # the torch twin
        heads = [[_pair(entries, item.index, li) for item in lay.chain[:lead]] for li in lin]
        h0 = chain_ops.compose_bodies(heads, transition=transition) if lead else None
        return {
            li: _LayerScan(_chain(lay, entries, li)[lead:], None, None if h0 is None else h0[row])
            for row, li in enumerate(lin)
        }
    try:
        tables = _tables(lay, entries, dev, len(lin), start=lead)
        ptrs = _tables(lay, entries, dev, len(lin), stop=lead).ptrs if lead else None
    except ValueError:  # mixed pair dtypes or devices: the chunked path converts as it goes
        return dict.fromkeys(lin)
    h0 = None
    if ptrs is not None:
        h0 = chain_ops.compose_body_pointers(ptrs, _pair(entries, lay.chain[0].index, lin[0]), transition=transition)
    return {li: _LayerScan([], (tables, row), None if h0 is None else h0[row]) for row, li in enumerate(lin)}


def _pair(entries: list[SegmentEntry | None], seg: int, li: int) -> tuple[torch.Tensor, torch.Tensor]:
    e = entries[seg]
    assert e is not None
    le = e.layers[li]
    assert isinstance(le, LinearEntry)
    return le.T, le.S


def _tables(
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    dev: torch.device,
    n_layers: int,
    *,
    start: int = 0,
    stop: int | None = None,
) -> combine_scan.ChainTables:
    """The fused scan's launch tables for all ``n_layers`` linear layers at once, for the chain's links
    ``start:stop``, from the entries' cached pair pointers (no per-layer, per-link Python work).
    Raises ``ValueError`` for pairs it cannot read."""
    meta: list[tuple[int, int, int]] = []
    blocks: list[torch.Tensor | None] = []
    dtypes: set[torch.dtype] = set()
    for item in lay.chain[start:stop]:
        if item.kind == "piece":
            meta.append((0, lay.cu_host[item.index], lay.cu_host[item.index + 1]))
            blocks.append(None)
            continue
        e = entries[item.index]
        assert e is not None
        here = e.device()
        if here is None or not same_device(here, dev):
            raise ValueError(f"pairs must be on {dev}")
        ptrs, dtype = e.pair_pointers()
        meta.append((1, 0, 0))
        blocks.append(ptrs)
        dtypes.add(dtype)
    if len(dtypes) > 1:
        raise ValueError("combine scan needs pairs of one dtype")
    return combine_scan.tables_from_pointers(meta, blocks, dtypes.pop() if dtypes else torch.float32, dev, n_layers)


@torch.no_grad()
def combine(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    spec: ModeSpec,
    *,
    fused_scan: bool | None = None,
    cold: ColdBatch | None = None,
) -> RequestState:
    """Build the request's working state from entries + active tokens; sets ``last_logits``.

    ``fused_scan``: run linear layers through the fused combine scan (True), the chunked path
    (False) or pick (None: fused on CUDA for few active tokens).

    ``cold``: segments without an entry yet, built in the same forward. Their entries (``cold.entries``,
    already placed in ``entries``) are filled layer by layer before the active tokens read them, and
    both token sets share every token-local stage (one ``mixer_in`` / ``mixer_out`` over the cold rows
    followed by the active rows: one read of the expert weights per layer instead of two)."""
    plan = _scan_plan(model, lay, entries, fused_scan, spec.transition, cold)
    h = model.embed(lay.active_ids)
    rows = 0  # cold rows ahead of the active ones in every token-local stage
    if cold is not None:
        h, rows = torch.cat([cold.embed(), h]), cold.n_tokens
    layers: list[LayerState] = []
    for li, layer in enumerate(model.layers):
        # token-local stages replay from CUDA graphs where enabled
        both = mixer_in(model, li, h)
        inputs = tuple(x[rows:] for x in both) if rows else both
        o_cold = cold.run_layer(li, layer, tuple(x[:rows] for x in both))[0] if cold is not None else None
        st: LayerState
        if layer.linear_attn is not None:
            o, st = _linear(layer.linear_attn, inputs, lay, entries, li, spec, plan[li])
            extra = both[1:2]  # z
        else:
            assert layer.self_attn is not None
            q, k, v = inputs[:3]
            o, st = _attention(layer.self_attn, q, k, v, lay, entries, li, spec)
            extra = both[3:]  # the output gate, if any
        layers.append(st)
        h = mixer_out(model, li, h, o if o_cold is None else torch.cat([o_cold, o]), *extra)
    logits = model.logits(h[-1:])[0]
    return RequestState(layers, lay.total, logits, tokens=list(lay.tokens))
