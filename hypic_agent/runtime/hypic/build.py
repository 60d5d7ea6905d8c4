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
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from hypic_agent.kernels.backend import to_device_async
from hypic_agent.kernels.gdn_pairs import PairSink, SeamSplit
from hypic_agent.runtime.forward import cu_seqlens_of
from hypic_agent.runtime.graphs import mixer_in, mixer_out
from hypic_agent.runtime.hypic.entry import AttentionEntry, LinearEntry, SegmentEntry
from hypic_agent.runtime.models.hybrid import DecoderLayer, HybridForCausalLM


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ColdBatch:
    """Cold segments as one packed isolated batch, run layer by layer into ``entries``.

    ``seams[i]`` tokens at the start of segment i form its seam window; its body pair covers the
    rest. Segments must be non-empty; ``0 <= seams[i] <= len(segments[i])``. Linear layers' pairs
    ``T [HV, K, K]`` / ``S [HV, K, V]`` (``pair_dtype``) and conv tails ``[C, W-1]`` are allocated
    here; attention layers' K/V ``[n, Hkv, D]`` are set when their layer runs.
    """

    def __init__(
        self,
        model: HybridForCausalLM,
        segments: Sequence[Sequence[int]],
        seams: Sequence[int],
        *,
        pair_dtype: torch.dtype = torch.float32,
    ) -> None:
        if not segments or any(len(s) == 0 for s in segments):
            raise ValueError("build_entries needs non-empty segments")
        p = next(model.parameters())
        dev = p.device
        self.model = model
        self.lengths = [len(s) for s in segments]
        self.ids = torch.tensor([t for s in segments for t in s], dtype=torch.long, device=dev)
        self.cu_host = cu_seqlens_of(self.lengths, torch.device("cpu"))  # attention reads bounds here: no sync
        self.cu = self.cu_host.to(dev)
        self.bounds = self.cu_host.tolist()
        self.pos = torch.cat([torch.arange(n, device=dev) for n in self.lengths])
        self.split = SeamSplit.build(self.lengths, seams, dev)  # windows / bodies, shared by every linear layer
        self.entries = [
            SegmentEntry(tuple(int(t) for t in s), seams[j], self._empty_layers(model, pair_dtype, p.dtype, dev))
            for j, s in enumerate(segments)
        ]
        # per linear layer: the entries' pair tensors as one sink (the pair kernels write into them)
        self.sinks = self._sinks(model, dev)

    @staticmethod
    def _empty_layers(
        model: HybridForCausalLM, pair_dtype: torch.dtype, dtype: torch.dtype, dev: torch.device
    ) -> list[LinearEntry | AttentionEntry]:
        layers: list[LinearEntry | AttentionEntry] = []
        for layer in model.layers:
            if (m := layer.linear_attn) is not None:
                layers.append(
                    LinearEntry(
                        torch.empty(m.hv, m.dk, m.dk, dtype=pair_dtype, device=dev),
                        torch.empty(m.hv, m.dk, m.dv, dtype=pair_dtype, device=dev),
                        torch.empty(m.conv_dim, m.kernel - 1, dtype=dtype, device=dev),
                    )
                )
            else:
                a = layer.self_attn
                assert a is not None
                empty = torch.empty(0, a.hkv, a.d, dtype=dtype, device=dev)
                layers.append(AttentionEntry(empty, empty))
        return layers

    def _linear(self, li: int) -> list[LinearEntry]:
        out = [e.layers[li] for e in self.entries]
        assert all(isinstance(x, LinearEntry) for x in out)
        return out  # type: ignore[return-value]

    def _sinks(self, model: HybridForCausalLM, dev: torch.device) -> dict[int, PairSink]:
        """Per linear layer, the entries' pair tensors as one sink; the pointer tables of all layers come
        from the entries' own cached pointers (``SegmentEntry.pair_pointers``, which the combine's scan
        tables read as well) in one host->device copy."""
        lin = [li for li, layer in enumerate(model.layers) if layer.linear_attn is not None]
        if not lin:
            return {}
        table = to_device_async(torch.stack([e.pair_pointers()[0] for e in self.entries], dim=1), dev)  # [L, N, 2]
        return {
            li: PairSink(tuple(x.T for x in self._linear(li)), tuple(x.S for x in self._linear(li)), table[row])
            for row, li in enumerate(lin)
        }

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
            mixed, z, g, beta = inputs
            ops, conv_final = mixer.convolve(mixed, z, g, beta, self.cu, None)
            o = mixer.mix_into_pairs(ops, self.cu, self.split, self.sinks[li])
            tails = [x.conv_tail for x in self._linear(li)]
            torch._foreach_copy_(tails, list(conv_final.unbind(0)))  # one launch, not one copy per entry
            return o, (z,)
        attn = layer.self_attn
        assert attn is not None
        q, k, v = inputs[:3]
        o = attn.attend(attn.rotate(q, self.pos), attn.rotate(k, self.pos), v, self.cu_host, self.cu_host)
        for j, e in enumerate(self.entries):
            a, b = self.bounds[j], self.bounds[j + 1]
            e.layers[li] = AttentionEntry(k[a:b].clone(), v[a:b].clone())
        return o, inputs[3:]  # the output gate, if any

    def set_cost(self, ms: float) -> None:
        """Spread a measured build time over the entries by token count (what a later hit saves)."""
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
) -> list[SegmentEntry]:
    """Prefill each segment in isolation (one packed batch) and return one entry per segment.

    ``seams[i]`` tokens at the start of segment i form its seam window; its body pair covers the
    rest. Segments must be non-empty; ``0 <= seams[i] <= len(segments[i])``.
    """
    batch = ColdBatch(model, segments, seams, pair_dtype=pair_dtype)
    dev = batch.ids.device
    _sync(dev)
    t0 = time.perf_counter()
    h = batch.embed()
    for li, layer in enumerate(model.layers):
        inputs = mixer_in(model, li, h)  # token-local stages replay from CUDA graphs where enabled
        o, extra = batch.run_layer(li, layer, inputs)
        h = mixer_out(model, li, h, o, *extra)
    _sync(dev)
    batch.set_cost((time.perf_counter() - t0) * 1e3)
    return batch.entries
