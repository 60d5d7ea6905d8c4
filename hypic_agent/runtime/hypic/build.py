"""Entry building: isolated prefill of cold segments, packed as one varlen batch.

Every segment runs from a zero state at local positions 0..n-1 (that is what makes the entry
position-independent). Each linear layer's body pair comes out of the same pass
(``GatedDeltaNet.mix_with_pairs``: on CUDA the pair shares the forward's WY factors).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from hypic_agent.kernels.gdn_pairs import SeamSplit
from hypic_agent.runtime.forward import cu_seqlens_of
from hypic_agent.runtime.graphs import mixer_in, mixer_out
from hypic_agent.runtime.hypic.entry import AttentionEntry, LinearEntry, SegmentEntry
from hypic_agent.runtime.models.hybrid import HybridForCausalLM


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    if not segments or any(len(s) == 0 for s in segments):
        raise ValueError("build_entries needs non-empty segments")
    dev = next(model.parameters()).device
    _sync(dev)
    t0 = time.perf_counter()
    lengths = [len(s) for s in segments]
    ids = torch.tensor([t for s in segments for t in s], dtype=torch.long, device=dev)
    cu_host = cu_seqlens_of(lengths, torch.device("cpu"))  # attention reads bounds here: no device sync
    cu = cu_host.to(dev)
    cu_list = cu_host.tolist()
    pos = torch.cat([torch.arange(n, device=dev) for n in lengths])
    split = SeamSplit.build(lengths, seams, dev)  # seam windows / bodies, shared by every linear layer

    per_seg: list[list[LinearEntry | AttentionEntry]] = [[] for _ in segments]
    h = model.embed(ids)
    for li, layer in enumerate(model.layers):
        inputs = mixer_in(model, li, h)  # token-local stages replay from CUDA graphs where enabled
        if layer.linear_attn is not None:
            mixer = layer.linear_attn
            mixed, z, g, beta = inputs
            ops, conv_final = mixer.convolve(mixed, z, g, beta, cu, None)
            o, _, T, S = mixer.mix_with_pairs(ops, cu, split)
            extra: tuple[torch.Tensor, ...] = (z,)
            for j in range(len(segments)):  # own copies: an entry never pins the batch's pair tensor
                Tj, Sj = T[j].to(pair_dtype, copy=True), S[j].to(pair_dtype, copy=True)
                per_seg[j].append(LinearEntry(Tj, Sj, conv_final[j].clone()))
        else:
            attn = layer.self_attn
            assert attn is not None
            q, k, v = inputs[:3]
            o = attn.attend(attn.rotate(q, pos), attn.rotate(k, pos), v, cu_host, cu_host)
            extra = inputs[3:]  # the output gate, if any
            for j in range(len(segments)):
                a, b = cu_list[j], cu_list[j + 1]
                per_seg[j].append(AttentionEntry(k[a:b].clone(), v[a:b].clone()))
        h = mixer_out(model, li, h, o, *extra)
    _sync(dev)
    ms = (time.perf_counter() - t0) * 1e3
    total = sum(lengths)
    return [
        SegmentEntry(tuple(int(t) for t in s), seams[j], per_seg[j], prefill_ms=ms * lengths[j] / total)
        for j, s in enumerate(segments)
    ]
