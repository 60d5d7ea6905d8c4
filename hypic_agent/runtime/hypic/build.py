"""Entry building: isolated prefill of cold segments, packed as one varlen batch.

Every segment runs from a zero state at local positions 0..n-1 (that is what makes the entry
position-independent). Each linear layer's body pair comes out of the same pass
(``GatedDeltaNet.mix_into_pairs``: on CUDA one shared-WY fla pass over windows and bodies, the
pairs written straight into the entries' tensors).

``ColdBatch`` runs the batch one layer at a time into entries whose tensors exist before the first
layer, so it can run on its own (``build_entries``) or inside the combine forward
(``combine(..., cold=batch)``): there the cold tokens share every token-local stage with the
request's active tokens, and the combine's scan tables already point at the pairs the batch
writes layer by layer.

``prefix`` (a ``BuildContext``'s tokens, ``build_context``): each segment is prefilled after those
K tokens instead, at positions ``-K..-1`` before its own ``0..n-1``. The prefix is part of every
segment's seam window in the split (the body pair still covers tokens ``seam..n-1`` from the
identity / zero state) and its rows never reach the entry.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from hypic_agent.kernels._varlen import concat_ranges, cu_seqlens
from hypic_agent.kernels.backend import to_device_async, upload_int64
from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit
from hypic_agent.runtime.hypic.entry import AttentionEntry, LinearEntry, SegmentEntry
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.linear_mixer import at
from hypic_agent.runtime.runner.cold_graphs import ColdGraphs, new_serial
from hypic_agent.runtime.runner.layer_loop import run_layers
from hypic_agent.runtime.runner.plan import plan_forward

if TYPE_CHECKING:
    from hypic_agent.runtime.runner.graph_set import GraphSet


def _carve(
    shapes: list[tuple[int, ...]], dtype: torch.dtype, dev: torch.device, one_block: bool | None = None
) -> list[torch.Tensor]:
    """Empty tensors of ``shapes``: on CUDA views of one allocation (each 256-byte aligned), so a cold
    entry costs two allocations rather than one per tensor (some 90 of 2-4 MB each for the
    Qwen3.5-35B-A3B shape); the tensors of one shape come out of one ``unbind`` (a few calls per
    entry, not two per tensor). Elsewhere separate tensors (a CPU tier holds them as they are, and
    safetensors refuses tensors that share memory). ``one_block``: force either way (None: by device)."""
    if not (dev.type == "cuda" if one_block is None else one_block):
        return [torch.empty(s, dtype=dtype, device=dev) for s in shapes]
    align = max(1, 256 // dtype.itemsize)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    rows = {shape: -(-math.prod(shape) // align) * align for shape in groups}  # padded numel per tensor
    block = torch.empty(sum(rows[sh] * len(ix) for sh, ix in groups.items()), dtype=dtype, device=dev)
    out: list[torch.Tensor] = [block] * len(shapes)
    start = 0
    for shape, idx in groups.items():
        n, row = math.prod(shape), rows[shape]
        region = block[start : start + row * len(idx)].view(len(idx), row)[:, :n].view(len(idx), *shape)
        for i, t in zip(idx, region.unbind(0), strict=True):
            out[i] = t
        start += row * len(idx)
    return out


def _layer_dims(model: HybridForCausalLM) -> list[tuple[tuple[int, ...], ...]]:
    """Per layer the shapes an entry's tensors need: linear ``(T shape, S shape, conv tail shape)``
    (GDN ``[HV, K, K]``, Mamba2 ``[HV]``, short conv ``[0]`` / ``[0, 0, 0]``: ``HybridConfig.linear_pair_shapes``),
    attention ``(key row, value row)``: ``(Hkv, D)`` twice, MLA ``(1, rope)`` and ``(1, r)`` (read once
    per batch: module attribute reads are slow in Python)."""
    cfg = model.config
    t_shape, s_shape = cfg.linear_pair_shapes
    tail = (cfg.linear_conv_dim, cfg.linear_conv_kernel_dim - 1)
    dims: list[tuple[tuple[int, ...], ...]] = []
    for layer in model.layers:
        if layer.linear_attn is not None:
            dims.append((t_shape, s_shape, tail))
        else:
            a = layer.self_attn
            assert a is not None
            dims.append((a.k_row, a.v_row))
    return dims


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ColdBatch:
    """Cold segments as one packed isolated batch, run layer by layer into ``entries``.

    ``seams[i]`` tokens at the start of segment i form its seam window; its body pair covers the
    rest. Segments must be non-empty; ``0 <= seams[i] <= len(segments[i])``. Linear layers' pairs
    ``T [HV, K, K]`` / ``S [HV, K, V]`` (``pair_dtype``), conv tails ``[C, W-1]`` and attention
    layers' K/V ``[n, Hkv, D]`` (MLA: ``[n, 1, rope]``, ``[n, 1, r]``) are allocated here and filled
    when their layer runs. ``prep_ms``: the host time of each part of this set-up (tables, seam split,
    entries, pair sinks), which the GPU waits for when the batch is built inside a request.
    ``prefix``: the build context's tokens ``[K]`` ahead of every segment (module doc); ``lengths``
    are the segments' own, the packed rows (``ids``, ``n_tokens``) include K per segment.
    """

    def __init__(
        self,
        model: HybridForCausalLM,
        segments: Sequence[Sequence[int]],
        seams: Sequence[int],
        *,
        pair_dtype: torch.dtype = torch.float32,
        prefix: Sequence[int] = (),
        graphs: ColdGraphs | None = None,
    ) -> None:
        """``graphs``: the runner's cold-core graphs (``GraphSet.colds``) the linear layers replay from
        (None: eager)."""
        if not segments or any(len(s) == 0 for s in segments):
            raise ValueError("build_entries needs non-empty segments")
        k = self.prefix_len = len(prefix)
        t0 = time.perf_counter()
        p = next(model.parameters())
        dev = p.device
        self.model = model
        self.graphs = graphs
        self.serial = new_serial()
        self.lengths = [len(s) for s in segments]  # the segments' own lengths (what the entries hold)
        packed = [k + n for n in self.lengths]  # with the prefix ahead of each
        # what a cold-core graph is captured for (``cold_graphs``): same key, same tables
        self.layout_key = (tuple(self.lengths), tuple(seams), pair_dtype, p.dtype, k)
        tokens = [tuple(map(int, s)) for s in segments]
        head = tuple(map(int, prefix))
        self.cu_host = cu_seqlens(packed)  # attention reads bounds here: no sync
        self.bounds = self.cu_host.tolist()
        # ids, bounds and local positions in one pinned upload (the GPU is idle until the forward starts)
        self.ids, cu, self.pos = upload_int64(
            [
                np.fromiter(itertools.chain.from_iterable(head + t for t in tokens), np.int64, self.bounds[-1]),
                self.bounds,
                concat_ranges([(-k, n) for n in self.lengths]),
            ],
            dev,
        )
        self.cu = cu.to(self.cu_host.dtype)
        t1 = time.perf_counter()
        # windows (prefix + seam) / bodies, shared by every linear layer
        self.split = SeamSplit.build(packed, [k + s for s in seams], dev)
        t2 = time.perf_counter()
        dims = _layer_dims(model)
        self.entries = [
            SegmentEntry(t, seams[j], self._empty_layers(dims, len(t), pair_dtype, p.dtype, dev))
            for j, t in enumerate(tokens)
        ]
        t3 = time.perf_counter()
        # per linear layer: the entries' pair tensors as one sink (the pair kernels write into them)
        self.sinks = self._sinks(model, dev)
        t4 = time.perf_counter()
        self.prep_ms = {
            "cold_tables_ms": (t1 - t0) * 1e3,
            "cold_split_ms": (t2 - t1) * 1e3,
            "cold_entries_ms": (t3 - t2) * 1e3,
            "cold_sinks_ms": (t4 - t3) * 1e3,
        }

    @staticmethod
    def _empty_layers(
        dims: list[tuple[tuple[int, ...], ...]], n: int, pair_dtype: torch.dtype, dtype: torch.dtype, dev: torch.device
    ) -> list[LinearEntry | AttentionEntry]:
        """One ``n``-token entry's tensors (``dims``: ``_layer_dims``), filled layer by layer: linear
        layers' pairs and conv tails, attention layers' K/V ``[n, Hkv, D]`` (``_carve``: on CUDA two
        allocations per entry)."""
        pair_shapes: list[tuple[int, ...]] = []
        shapes: list[tuple[int, ...]] = []  # conv tails and K/V, in the model's dtype
        for d in dims:
            if len(d) == 3:  # linear: T, S, conv tail
                pair_shapes += [d[0], d[1]]
                shapes.append(d[2])
            else:  # attention: key row, value row
                shapes += [(n, *d[0]), (n, *d[1])]
        pairs, rest = iter(_carve(pair_shapes, pair_dtype, dev)), iter(_carve(shapes, dtype, dev))
        return [
            LinearEntry(next(pairs), next(pairs), next(rest)) if len(d) == 3 else AttentionEntry(next(rest), next(rest))
            for d in dims
        ]

    def _linear(self, li: int) -> list[LinearEntry]:
        out = [e.layers[li] for e in self.entries]
        assert all(isinstance(x, LinearEntry) for x in out)
        return out  # type: ignore[return-value]

    def _sinks(self, model: HybridForCausalLM, dev: torch.device) -> dict[int, PairSink]:
        """Per linear layer, the entries' pair tensors as one sink; the pointer tables of all layers come
        from the entries' own cached pointers (``SegmentEntry.pair_pointers``, which the combine's scan
        tables read as well) in one host->device copy."""
        lin = [li for li, layer in enumerate(model.layers) if layer.linear_attn is not None]
        self.sink_row = {li: row for row, li in enumerate(lin)}
        self.table = torch.empty(0, dtype=torch.int64, device=dev)
        if not lin:
            return {}
        self.table = to_device_async(torch.stack([e.pair_pointers()[0] for e in self.entries], dim=1), dev)  # [L, N, 2]
        sinks = {}
        for row, li in enumerate(lin):
            layer = self._linear(li)
            sinks[li] = PairSink(tuple(x.T for x in layer), tuple(x.S for x in layer), self.table[row])
        return sinks

    @property
    def n_tokens(self) -> int:
        return self.ids.shape[0]

    def embed(self) -> torch.Tensor:
        """``[Tc, D]`` input embeddings of the packed cold tokens."""
        return self.model.embed(self.ids)

    def run_layer(
        self, li: int, layer: DecoderLayer, inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Layer ``li``'s mixer over the cold tokens from ``inputs`` (``DecoderLayer.mixer_in`` of
        their hidden states); fills the entries' layer ``li`` -> (o, extra) for ``mixer_out``."""
        if layer.linear_attn is not None:
            mixer = layer.linear_attn

            def core(sink: PairSink, *xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                ops, conv_final = mixer.convolve(*xs, self.cu, None, **at(mixer, self.pos))
                return mixer.mix_into_pairs(ops, self.cu, self.split, sink), conv_final

            if self.graphs is not None and layer.mixer_kind == "gdn":  # replayed per layout where it can be
                o, conv_final = self.graphs.run(self, li, core, tuple(inputs[:4]))
            else:
                o, conv_final = core(self.sinks[li], *inputs)
            tails = [x.conv_tail for x in self._linear(li)]
            torch._foreach_copy_(tails, list(conv_final.unbind(0)))  # one launch, not one copy per entry
            if self.prefix_len:  # a segment shorter than the tail: the columns before it stay zero
                for tail, n in zip(tails, self.lengths, strict=True):
                    if n < tail.shape[-1]:
                        tail[:, : tail.shape[-1] - n].zero_()
            return o, inputs[1:2]  # the output stage's extra (GDN: z)
        attn = layer.self_attn
        assert attn is not None
        q, k, v = inputs[:3]
        o = attn.attend(attn.rotate(q, self.pos), attn.rotate(k, self.pos), v, self.cu_host, self.cu_host)
        spans = [(a + self.prefix_len, b) for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]
        dst = [x for e in self.entries for x in vars(e.layers[li]).values()]  # k, v per entry
        torch._foreach_copy_(dst, [x[a:b] for a, b in spans for x in (k, v)])  # one launch
        return o, inputs[3:]  # the output gate, if any

    def set_cost(self, ms: float) -> None:
        """Spread a measured build time (prefix rows included) over the entries by token count (what a
        later hit saves)."""
        total = sum(self.lengths)
        for e, n in zip(self.entries, self.lengths, strict=True):
            e.prefill_ms = ms * n / total


@torch.no_grad()
def build_entries(
    model: HybridForCausalLM,
    segments: Sequence[Sequence[int]],
    seams: Sequence[int],
    *,
    pair_dtype: torch.dtype = torch.float32,
    prefix: Sequence[int] = (),
    graphs: GraphSet | None = None,
) -> list[SegmentEntry]:
    """Prefill each segment in isolation (one packed batch) and return one entry per segment.

    ``seams[i]`` tokens at the start of segment i form its seam window; its body pair covers the
    rest. Segments must be non-empty; ``0 <= seams[i] <= len(segments[i])``. ``prefix``: tokens each
    segment is prefilled after (``BuildContext.tokens``; their rows are not in the entries).
    ``graphs``: the runner's graphs to replay from (None: eager).
    """
    colds, stages = (graphs.colds, graphs.stages) if graphs is not None else (None, None)
    batch = ColdBatch(model, segments, seams, pair_dtype=pair_dtype, prefix=prefix, graphs=colds)
    dev = batch.ids.device
    _sync(dev)
    t0 = time.perf_counter()
    run_layers(model, plan_forward(None, [], [], colds=(batch,), device=dev), None, stages)
    _sync(dev)
    batch.set_cost((time.perf_counter() - t0) * 1e3)
    return batch.entries
