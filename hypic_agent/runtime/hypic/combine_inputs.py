"""What a combine forward reads besides its layout and the weights, planned on the host once per
request (``combine_inputs``):

* per linear layer its scan plan (``LayerScan``): the fused scan's chain, as launch tables read by
  pointer on CUDA (``kernels.combine_scan.ChainTables``, one table for all layers) or as links for
  the torch twin; None runs the chunked path;
* ``lead``: the bodies at the head of a ``w = 0`` prompt do not depend on the forward, so all layers'
  chains of them are composed first, in one launch (``chain.compose_body_pointers``; the twin
  ``chain.compose_bodies``), and each layer's scan starts from its composed state;
* ``splice``: the conv tails and attention bodies by pointer (``splice.SpliceTables``).

Everything on the device that the forward reads is either layout (equal for equal
``CombineLayout.shape_key``) or a pointer table; ``CombineInputs.refresh`` rewrites the tables in
place for another request of the same layout, which is how a CUDA graph of the forward is replayed
(``combine_graphs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hypic_agent.kernels import chain as chain_ops
from hypic_agent.kernels import combine_scan
from hypic_agent.kernels.backend import refill_async, resolve_triton, same_device
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.hypic import splice as splice_ops
from hypic_agent.runtime.hypic.entry import LinearEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.models.hybrid import HybridForCausalLM


@dataclass
class LayerScan:
    """A linear layer's chain for the fused scan (read by the torch twin; empty with tables) and its
    row of the Triton launch tables (None: the twin)."""

    chain: list[combine_scan.ChainLink]
    tables: tuple[combine_scan.ChainTables, int] | None = None


@dataclass
class Lead:
    """Leading bodies composed at the start of the forward, for every linear layer: by their pair
    pointers ``[L_lin, n, 2]`` on the device (Triton, ``ptrs``) or from the pairs themselves (the
    torch twin, ``pairs``: L_lin chains); ``like``: one pair for shapes and dtype."""

    like: tuple[torch.Tensor, torch.Tensor]
    transition: bool
    ptrs: torch.Tensor | None = None
    pairs: list[list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def compose(self) -> torch.Tensor:
        """``[L_lin, HV, K, V]`` fp32"""
        if self.ptrs is not None:
            return chain_ops.compose_body_pointers(self.ptrs, self.like, transition=self.transition)
        assert self.pairs is not None
        return chain_ops.compose_bodies(self.pairs, transition=self.transition)


@dataclass
class CombineInputs:
    plan: dict[int, LayerScan | None]  # linear layer index -> its scan (None: the chunked path)
    lead: Lead | None = None
    splice: splice_ops.SpliceTables | None = None
    start: int = 0  # first chain link of the scan tables (the leading bodies come before it)
    kernels: KernelConfig = DEFAULT_KERNELS  # the kernel choices planned for (the forward runs with them)

    @property
    def lin_row(self) -> dict[int, int]:
        """Linear layer index -> its row in the per-linear-layer tables (``plan`` order)."""
        return {li: r for r, li in enumerate(self.plan)}

    def by_pointer(self) -> bool:
        """Whether the forward reads every cached tensor through these tables (CUDA graphs need it)."""
        return self.splice is not None and all(p is not None and p.tables is not None for p in self.plan.values())

    def tables(self) -> combine_scan.ChainTables | None:
        return next((p.tables[0] for p in self.plan.values() if p is not None and p.tables is not None), None)

    def refresh(self, model: HybridForCausalLM, lay: CombineLayout, entries: list[SegmentEntry | None]) -> None:
        """Rewrite every pointer table in place for ``entries`` of a layout equal to the one these
        inputs were planned for (same ``shape_key``); the device tensors keep their addresses."""
        dev = lay.active_ids.device
        tab = self.tables()
        if tab is not None:
            _, ptrs, dtype = _host_pairs(lay, entries, len(self.plan), start=self.start, device=dev)
            if dtype != tab.pair_dtype and ptrs.any():
                raise ValueError(f"pairs are {dtype}, the tables were planned for {tab.pair_dtype}")
            refill_async(tab.ptrs, ptrs)
            tab.ptrs_host = ptrs
            if tab._steps is not None:
                refill_async(tab._steps.ptrs, tab._steps.step_pointers(ptrs))
        if self.lead is not None and self.lead.ptrs is not None:
            _, ptrs, dtype = _host_pairs(lay, entries, len(self.plan), stop=self.start, device=dev)
            if dtype != self.lead.like[0].dtype:
                raise ValueError(f"pairs are {dtype}, the leading bodies were planned for {self.lead.like[0].dtype}")
            refill_async(self.lead.ptrs, ptrs)
        if self.splice is not None:
            self.splice.refresh(model, lay, entries)


def chain_links(lay: CombineLayout, entries: list[SegmentEntry | None], li: int) -> list[combine_scan.ChainLink]:
    """Layer ``li``'s chain in prompt order: pieces (active token ranges) and cached body pairs."""
    out: list[combine_scan.ChainLink] = []
    for item in lay.chain:
        if item.kind == "piece":
            out.append(combine_scan.Piece(lay.cu_host[item.index], lay.cu_host[item.index + 1]))
        else:
            le: LinearEntry = entries[item.index].layers[li]  # type: ignore[union-attr,assignment]
            out.append(combine_scan.Body(le.T, le.S))
    return out


def pair(entries: list[SegmentEntry | None], seg: int, li: int) -> tuple[torch.Tensor, torch.Tensor]:
    e = entries[seg]
    assert e is not None
    le = e.layers[li]
    assert isinstance(le, LinearEntry)
    return le.T, le.S


def _host_pairs(
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    n_layers: int,
    *,
    start: int = 0,
    stop: int | None = None,
    device: torch.device | None = None,
) -> tuple[list[tuple[int, int, int]], torch.Tensor, torch.dtype]:
    """The chain's links ``start:stop`` as (meta rows, host pointers ``[L, n, 2]``, pair dtype), from
    the entries' cached pair pointers. Raises ``ValueError`` for pairs it cannot read (not on
    ``device``, mixed dtypes)."""
    meta: list[tuple[int, int, int]] = []
    blocks: list[torch.Tensor] = []
    dtypes: set[torch.dtype] = set()
    zero = torch.zeros(n_layers, 2, dtype=torch.int64)
    for item in lay.chain[start:stop]:
        if item.kind == "piece":
            meta.append((0, lay.cu_host[item.index], lay.cu_host[item.index + 1]))
            blocks.append(zero)
            continue
        e = entries[item.index]
        assert e is not None
        if device is not None:
            here = e.device()
            if here is None or not same_device(here, device):
                raise ValueError(f"pairs must be on {device}")
        ptrs, dtype = e.pair_pointers()
        meta.append((1, 0, 0))
        blocks.append(ptrs)
        dtypes.add(dtype)
    if len(dtypes) > 1:
        raise ValueError("combine scan needs pairs of one dtype")
    ptrs = torch.stack(blocks, dim=1) if blocks else torch.zeros(n_layers, 0, 2, dtype=torch.int64)
    return meta, ptrs, dtypes.pop() if dtypes else torch.float32


def pair_tables(
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    dev: torch.device,
    n_layers: int,
    *,
    start: int = 0,
    stop: int | None = None,
) -> combine_scan.ChainTables:
    """The fused scan's launch tables for all ``n_layers`` linear layers at once, for the chain's links
    ``start:stop`` (no per-layer, per-link Python work). Raises ``ValueError`` for pairs it cannot read."""
    meta, ptrs, dtype = _host_pairs(lay, entries, n_layers, start=start, stop=stop, device=dev)
    return combine_scan.tables_from_host(meta, ptrs, dtype, dev)


def combine_inputs(
    model: HybridForCausalLM,
    lay: CombineLayout,
    entries: list[SegmentEntry | None],
    transition: bool,
    fused_scan: bool | None = None,
    building: Sequence[SegmentEntry] = (),
    *,
    kernels: KernelConfig = DEFAULT_KERNELS,
) -> CombineInputs:
    """Plan the request's forward inputs. ``fused_scan``: the fused scan (True), the chunked path
    (False) or pick (None: fused Triton on CUDA for at most ``combine_scan.MAX_TOKENS`` active tokens).
    ``kernels``: the kernel choices (the scan, whether the leading bodies are composed first), kept
    on the inputs for the forward.

    The leading bodies stop at the first piece and at the first entry of ``building`` (entries the
    same forward builds, ``ColdBatch.entries``: their pairs exist only once their layer has run);
    with ``precompose_leading_bodies`` off there are none (each layer's scan runs them). A layout
    reading such entries reads them directly (no splice tables)."""
    dev = lay.active_ids.device
    ids = {id(e) for e in building}
    reads_building = any(id(e) in ids for e in entries if e is not None)
    splice = splice_ops.build(model, lay, entries, dev) if not reads_building else None
    lin = [i for i, layer in enumerate(model.layers) if layer.linear_attn is not None]
    if not lin or fused_scan is False or model.layers[lin[0]].mixer_kind != "gdn":  # the fused scan is GDN's
        return CombineInputs(dict.fromkeys(lin), splice=splice, kernels=kernels)
    mixer = model.layers[lin[0]].linear_attn
    assert mixer is not None
    triton = resolve_triton(mixer.backend, dev)
    if fused_scan is None and not (triton and lay.active_ids.numel() <= combine_scan.MAX_TOKENS):
        return CombineInputs(dict.fromkeys(lin), splice=splice, kernels=kernels)
    lead = next(
        (i for i, item in enumerate(lay.chain) if item.kind != "body" or id(entries[item.index]) in ids),
        len(lay.chain),
    )
    lead = lead if kernels.precompose_leading_bodies else 0
    like = pair(entries, lay.chain[0].index, lin[0]) if lead else None
    if not triton:  # the torch twin
        heads = [[pair(entries, item.index, li) for item in lay.chain[:lead]] for li in lin]
        first = None if like is None else Lead(like, transition, pairs=heads)
        plan = {li: LayerScan(chain_links(lay, entries, li)[lead:]) for li in lin}
        return CombineInputs(plan, first, splice, lead, kernels)  # type: ignore[arg-type]
    try:
        tables = pair_tables(lay, entries, dev, len(lin), start=lead)
        lead_ptrs = pair_tables(lay, entries, dev, len(lin), stop=lead).ptrs if lead else None
    except ValueError:  # mixed pair dtypes or devices: the chunked path converts as it goes
        return CombineInputs(dict.fromkeys(lin), splice=splice, kernels=kernels)
    tables.wy_steps()  # planned now: nothing in the forward copies from the host
    first = None if like is None else Lead(like, transition, ptrs=lead_ptrs)
    plan = {li: LayerScan([], (tables, row)) for row, li in enumerate(lin)}
    return CombineInputs(plan, first, splice, lead, kernels)  # type: ignore[arg-type]
