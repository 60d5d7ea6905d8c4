"""Differentiable forward of a ``HybridForCausalLM`` over equal-length blocks ``[B, L]``.

The runtime's ``forward.prefill`` is inference-only (``no_grad``, packed varlen, per-sequence
state). Training needs autograd, batch-first tensors and fast kernels: attention runs through
``F.scaled_dot_product_attention`` (causal, native GQA), the GDN short conv through
``F.conv1d`` and the delta rule through a ``gdn_train`` backend. The modules (projections,
norms, gates, MLPs) are the runtime's own, so a model trained here runs unchanged there.

``probe(layer, name, tensor)`` sees intermediates (``x`` = normed mixer input ``[B, L, D]``,
``q`` / ``k`` un-rotated ``[B, L, H, Dh]``, ``o`` = attention output before ``o_proj``
``[B, L, H, Dh]``); calibration uses it. ``windows`` (``{layer: w}``) restricts those attention
layers to a causal sliding window (query i sees keys ``i - w < j <= i``); ``select_layers`` uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.gated_deltanet import GatedDeltaNet
from hypic_agent.training.gdn_train import GdnFn, chunk_gdn_torch

Probe = Callable[[int, str, torch.Tensor], None]


@dataclass
class ForwardOut:
    """``final [B, L, D]``: residual stream after the last layer (before the final norm);
    ``hiddens``: each layer's output ``[B, L, D]`` when captured."""

    final: torch.Tensor
    hiddens: list[torch.Tensor] = field(default_factory=list)


def gdn_mixer(
    mix: GatedDeltaNet, x: torch.Tensor, gdn: GdnFn = chunk_gdn_torch, probe: Probe | None = None, idx: int = -1
) -> torch.Tensor:
    """GDN layer over ``x [B, L, D]`` from zero state -> ``[B, L, D]``."""
    B, L, D = x.shape
    mixed, z, b, a = mix.project(x.reshape(B * L, D))
    w = mix.conv1d.weight  # [C, 1, W]
    conv = F.conv1d(F.pad(mixed.view(B, L, -1).transpose(1, 2), (w.shape[-1] - 1, 0)), w, groups=w.shape[0])
    qkv = F.silu(conv).transpose(1, 2)  # [B, L, C]
    q, k, v = torch.split(qkv, [mix.key_dim, mix.key_dim, mix.value_dim], dim=-1)
    g, beta = mix.gates(a, b)
    o = gdn(
        q.reshape(B, L, mix.h, mix.dk),
        k.reshape(B, L, mix.h, mix.dk),
        v.reshape(B, L, mix.hv, mix.dv),
        g.view(B, L, mix.hv),
        beta.view(B, L, mix.hv),
    )
    if probe is not None:
        probe(idx, "o", o)
    return mix.output(o.reshape(B * L, mix.hv, mix.dv), z).view(B, L, D)


def sliding_window_mask(length: int, window: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean ``[L, L]`` mask, True where query i may attend key j: ``0 <= i - j < window``."""
    if window < 1:
        raise ValueError(f"attention window must be >= 1, got {window}")
    i = torch.arange(length, device=device)
    back = i[:, None] - i[None, :]  # [L, L] query - key
    return (back >= 0) & (back < window)


def attention_mixer(
    attn: FullAttention,
    x: torch.Tensor,
    positions: torch.Tensor,
    probe: Probe | None = None,
    idx: int = -1,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention over ``x [B, L, D]`` at ``positions [B*L]`` -> ``[B, L, D]``.

    ``window``: each query sees only itself and the ``window - 1`` keys before it (None: all)."""
    B, L, D = x.shape
    mask = None if window is None else sliding_window_mask(L, window, x.device)
    q, k, v, gate = attn.qkv(x.reshape(B * L, D))
    if probe is not None:
        probe(idx, "q", q.view(B, L, attn.hq, attn.d))
        probe(idx, "k", k.view(B, L, attn.hkv, attn.d))
    q, k = attn.rotate(q, positions), attn.rotate(k, positions)
    o = F.scaled_dot_product_attention(
        q.view(B, L, attn.hq, attn.d).transpose(1, 2),
        k.view(B, L, attn.hkv, attn.d).transpose(1, 2).to(q.dtype),
        v.view(B, L, attn.hkv, attn.d).transpose(1, 2).to(q.dtype),
        attn_mask=mask,
        is_causal=mask is None,
        scale=attn.scale,
        enable_gqa=attn.hq != attn.hkv,
    ).transpose(1, 2)  # [B, L, H, Dh]
    if probe is not None:
        probe(idx, "o", o)
    return attn.output(o.reshape(B * L, attn.hq, attn.d), gate).view(B, L, D)


def layer_forward(
    layer: DecoderLayer,
    h: torch.Tensor,
    positions: torch.Tensor,
    gdn: GdnFn = chunk_gdn_torch,
    probe: Probe | None = None,
    idx: int = -1,
    window: int | None = None,
) -> torch.Tensor:
    """One decoder block: ``h + mixer(norm(h))``, then ``+ mlp(norm(.))``. h ``[B, L, D]``.

    ``window``: sliding attention window of an attention layer (``attention_mixer``)."""
    x = layer.input_layernorm(h)
    if probe is not None:
        probe(idx, "x", x)
    if layer.linear_attn is not None:
        assert isinstance(layer.linear_attn, GatedDeltaNet), "training runs Gated DeltaNet hybrids only"
        if window is not None:
            raise ValueError(f"layer {idx} is a linear layer: an attention window applies to attention layers")
        y = gdn_mixer(layer.linear_attn, x, gdn, probe, idx)
    else:
        assert layer.self_attn is not None
        y = attention_mixer(layer.self_attn, x, positions, probe, idx, window)
    h = h + y
    return layer.feed_forward(h.reshape(-1, h.shape[-1])).view(h.shape)  # MoE blocks take [T, D]


def run_model(
    model: HybridForCausalLM,
    ids: torch.Tensor,
    *,
    gdn: GdnFn = chunk_gdn_torch,
    capture: bool = False,
    layer_inputs: Sequence[torch.Tensor] | None = None,
    grad_checkpoint: bool = False,
    probe: Probe | None = None,
    windows: Mapping[int, int] | None = None,
) -> ForwardOut:
    """Run ``ids [B, L]`` through every layer.

    ``layer_inputs`` (teacher forcing, one ``[B, L, D]`` per layer): layer i reads
    ``layer_inputs[i]`` instead of layer i-1's output, so each layer learns in isolation.
    ``grad_checkpoint`` recomputes each layer in the backward pass (less memory).
    ``windows``: ``{layer: w}`` sliding attention windows of some attention layers (the rest see all keys).
    """
    B, L = ids.shape
    if windows and not all(0 <= i < len(model.layers) for i in windows):
        raise ValueError(f"windows names layers {sorted(windows)}; the model has {len(model.layers)}")
    positions = torch.arange(L, device=ids.device).repeat(B)
    h = model.embed(ids)
    hiddens: list[torch.Tensor] = []
    for i, layer in enumerate(model.layers):
        inp = layer_inputs[i] if layer_inputs is not None else h
        w = windows.get(i) if windows else None
        if grad_checkpoint and torch.is_grad_enabled():
            h = checkpoint(layer_forward, layer, inp, positions, gdn, probe, i, w, use_reentrant=False)
        else:
            h = layer_forward(layer, inp, positions, gdn, probe, i, w)
        if capture:
            hiddens.append(h)
    return ForwardOut(h, hiddens)


def layer_inputs_of(embeddings: torch.Tensor, hiddens: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Inputs of each layer from a captured run: ``[emb, h_0, ..., h_{n-2}]``."""
    return [embeddings, *hiddens[:-1]]
