"""Body pairs staged for a captured combine forward of a model whose linear layers are not GDN.

GDN's combine reads every cached pair through pointer tables (``combine_inputs``), so a captured
forward serves any request of its layout once the tables are rewritten. The other linear kinds
(KDA, Mamba2, Lightning, short convolutions) run the chunked path, which stacks each body's pair
``(T, S)`` from the entries themselves: a graph of it would keep reading the capturing request's
pairs. Their graph reads staging buffers instead, one per (body, linear layer) pair, and every
replay first copies the request's pairs into them (``StagedPairs.fill``: one multi-tensor copy on
the device, no host work per layer). Conv tails and attention keys / values still come through the
splice tables by pointer (``splice.SpliceTables``), which ``CombineInputs.refresh`` rewrites.

A copy per replay costs the pairs' bytes twice in HBM traffic (for a few bodies of a large model,
under a millisecond of bandwidth) against the host time of launching the forward's kernels one by
one, which it saves (measured on the H200, see docs/benchmarks.md, ttft).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.runtime.hypic.entry import LinearEntry, SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout


def _body_pairs(lay: CombineLayout, entries: list[SegmentEntry | None]) -> list[torch.Tensor]:
    """Every tensor a chunked-path forward reads from the entries: for each body of the chain (in
    chain order) each linear layer's ``T`` then ``S``."""
    out: list[torch.Tensor] = []
    for item in lay.chain:
        if item.kind != "body":
            continue
        e = entries[item.index]
        assert e is not None
        for le in e.layers:
            if isinstance(le, LinearEntry):
                out += (le.T, le.S)
    return out


@dataclass
class StagedPairs:
    """``entries``: the request's entries with each body's linear pairs replaced by buffers (what the
    captured forward reads); ``buffers``: those buffers in ``_body_pairs`` order."""

    entries: list[SegmentEntry | None]
    buffers: list[torch.Tensor]

    @staticmethod
    def stage(lay: CombineLayout, entries: list[SegmentEntry | None]) -> StagedPairs:
        """Copies of ``entries`` whose bodies' pairs are fresh buffers holding the same values."""
        staged = list(entries)
        for item in lay.chain:
            if item.kind != "body" or staged[item.index] is not entries[item.index]:
                continue
            e = entries[item.index]
            assert e is not None
            layers = [
                LinearEntry(le.T.clone(), le.S.clone(), le.conv_tail) if isinstance(le, LinearEntry) else le
                for le in e.layers
            ]
            staged[item.index] = SegmentEntry(e.token_ids, e.seam, layers, e.prefill_ms)
        return StagedPairs(staged, _body_pairs(lay, staged))

    def fill(self, lay: CombineLayout, entries: list[SegmentEntry | None]) -> None:
        """Copy the bodies' pairs of ``entries`` (a request of the staged layout) into the buffers.
        Raises ``ValueError`` for pairs of another shape, dtype or device (the caller runs eagerly)."""
        src = _body_pairs(lay, entries)
        if len(src) != len(self.buffers):
            raise ValueError(f"{len(src)} body pairs, the staged graph reads {len(self.buffers)}")
        for s, b in zip(src, self.buffers, strict=True):
            if s.shape != b.shape or s.dtype != b.dtype or s.device != b.device:
                raise ValueError(f"a pair {tuple(s.shape)} {s.dtype} on {s.device}, staged {tuple(b.shape)} {b.dtype}")
        if self.buffers:
            torch._foreach_copy_(self.buffers, src)
