"""Differentiable forward of a student *as HYPIC serves it*: segments cached in isolation, seams
and suffix recomputed in context.

A training block ``ids [B, L]`` is cut into ``n`` equal segments of ``Ls`` tokens plus a suffix
(``L = n * Ls + Ls_suffix``). At serving time (``runtime/hypic``) each segment is prefilled alone
from a zero state at local positions, its first ``w`` tokens (the seam) are recomputed in context
and its body comes from that isolated pass. This module computes exactly that, with autograd:

* **isolated stream** ``[B*n, Ls]``: every segment alone (local positions, zero state, causal
  inside the segment), as ``build_entries`` runs it;
* **active stream** ``[B, G]``: the seam tokens of every segment plus the suffix, at global
  positions, as ``combine`` runs it.

Per layer, the active stream reads a *composed* sequence ``[B, L]`` in which body positions hold
isolated-stream values and active positions hold active-stream values:

* Gated DeltaNet: the short conv and the delta rule run over the composed pre-conv inputs and
  conv outputs (the runtime's ``T_body S + S_body`` equals the recurrence over those body
  inputs; the conv tail is the previous body's), and the outputs are read at active positions;
* attention: active queries attend causally over composed keys / values (body keys rotated at
  global positions, i.e. re-rotated as ``hypic`` does).

``hypic_run(...).final`` are the active tokens' final residuals; their logits equal the runtime's
``hypic`` mode (``tests/training/test_hypic_forward.py``), so KL on them against the one-pass
teacher trains the student for cached prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.models.layers.attention import FullAttention
from hypic_agent.runtime.models.layers.decoder import DecoderLayer
from hypic_agent.runtime.models.layers.gated_deltanet import GatedDeltaNet
from hypic_agent.training.gdn_train import GdnFn, chunk_gdn_torch


@dataclass(frozen=True)
class SegmentPlan:
    """``n_segments`` segments of ``segment_len`` tokens, seam ``seam`` tokens, then ``suffix_len``."""

    n_segments: int
    segment_len: int
    seam: int
    suffix_len: int

    def __post_init__(self) -> None:
        if self.n_segments < 1 or self.segment_len < 1 or self.suffix_len < 1:
            raise ValueError(f"need >= 1 segment, segment_len >= 1 and a suffix; got {self}")
        if not 0 <= self.seam < self.segment_len:
            raise ValueError(f"seam must be in [0, segment_len); got {self}")

    @property
    def total(self) -> int:
        return self.n_segments * self.segment_len + self.suffix_len

    @property
    def segmented(self) -> int:
        return self.n_segments * self.segment_len

    def seam_positions(self) -> list[int]:
        return [s * self.segment_len + j for s in range(self.n_segments) for j in range(self.seam)]

    def active_positions(self) -> list[int]:
        """Global positions of the active stream: every seam, then the suffix (sorted)."""
        return self.seam_positions() + list(range(self.segmented, self.total))


def plan_for(seq: int, segment_len: int, seam: int, min_suffix: int) -> SegmentPlan:
    """As many ``segment_len`` segments as leave at least ``min_suffix`` tokens of suffix in ``seq``."""
    n = (seq - min_suffix) // segment_len
    if n < 1:
        raise ValueError(f"seq {seq} holds no segment of {segment_len} plus a suffix of {min_suffix}")
    return SegmentPlan(n, segment_len, seam, seq - n * segment_len)


@dataclass
class _Index:
    """Index tensors of a plan on a device."""

    plan: SegmentPlan
    active: torch.Tensor  # [G] global positions of active tokens
    seams: torch.Tensor  # [n*w] global positions of seam tokens
    local_pos: torch.Tensor  # [B*n*Ls] isolated positions 0..Ls-1 per segment
    iso_global_pos: torch.Tensor  # [B*n*Ls] global positions of isolated tokens
    active_pos: torch.Tensor  # [B*G] global positions of active tokens
    mask: torch.Tensor  # [G, L] bool: key position <= query position
    batch: int

    @classmethod
    def build(cls, plan: SegmentPlan, batch: int, device: torch.device) -> _Index:
        active = torch.tensor(plan.active_positions(), dtype=torch.long, device=device)
        seams = torch.tensor(plan.seam_positions(), dtype=torch.long, device=device)
        local = torch.arange(plan.segment_len, device=device).repeat(batch * plan.n_segments)
        iso_global = torch.arange(plan.segmented, device=device).repeat(batch)
        keys = torch.arange(plan.total, device=device)
        return cls(
            plan, active, seams, local, iso_global, active.repeat(batch), keys[None, :] <= active[:, None], batch
        )

    def compose(self, iso: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """Isolated ``[B*n, Ls, ...]`` and active ``[B, G, ...]`` values -> composed ``[B, L, ...]``
        (active values at active positions, isolated ones elsewhere)."""
        p, b = self.plan, self.batch
        n_seam = p.n_segments * p.seam
        out = torch.cat([iso.reshape(b, p.segmented, *iso.shape[2:]), act[:, n_seam:]], dim=1)
        return out.index_copy(1, self.seams, act[:, :n_seam]) if n_seam else out


def _attention(
    attn: FullAttention, xi: torch.Tensor, xa: torch.Tensor, ix: _Index
) -> tuple[torch.Tensor, torch.Tensor]:
    """xi ``[B*n, Ls, D]``, xa ``[B, G, D]`` -> mixer outputs of both streams (same shapes)."""
    bn, ls, d = xi.shape
    b, g, _ = xa.shape
    q, k, v, gate = attn.qkv(torch.cat([xi.reshape(-1, d), xa.reshape(-1, d)]))
    ni = bn * ls
    qi, ki, vi = q[:ni], k[:ni], v[:ni]
    rep = attn.hq // attn.hkv

    def heads(x: torch.Tensor, rows: int, length: int) -> torch.Tensor:  # [T, H, Dh] -> [rows, Hq, length, Dh]
        x = x.view(rows, length, x.shape[-2], attn.d).transpose(1, 2)
        return x.repeat_interleave(rep, dim=1) if x.shape[1] != attn.hq else x

    oi = F.scaled_dot_product_attention(
        heads(attn.rotate(qi, ix.local_pos), bn, ls),
        heads(attn.rotate(ki, ix.local_pos).to(qi.dtype), bn, ls),
        heads(vi.to(qi.dtype), bn, ls),
        is_causal=True,
        scale=attn.scale,
    ).transpose(1, 2)  # [B*n, Ls, Hq, Dh]
    qa = attn.rotate(q[ni:], ix.active_pos)
    ka = attn.rotate(k[ni:], ix.active_pos)
    kc = ix.compose(attn.rotate(ki, ix.iso_global_pos).view(bn, ls, attn.hkv, attn.d), ka.view(b, g, attn.hkv, attn.d))
    vc = ix.compose(vi.view(bn, ls, attn.hkv, attn.d), v[ni:].view(b, g, attn.hkv, attn.d))
    L = ix.plan.total
    oa = F.scaled_dot_product_attention(
        heads(qa, b, g),
        heads(kc.reshape(b * L, attn.hkv, attn.d).to(qa.dtype), b, L),
        heads(vc.reshape(b * L, attn.hkv, attn.d).to(qa.dtype), b, L),
        attn_mask=ix.mask,
        scale=attn.scale,
    ).transpose(1, 2)  # [B, G, Hq, Dh]
    o = torch.cat([oi.reshape(ni, attn.hq, attn.d), oa.reshape(b * g, attn.hq, attn.d)])
    y = attn.output(o, gate)
    return y[:ni].view(bn, ls, d), y[ni:].view(b, g, d)


def _causal_conv(mixed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv, no activation: mixed ``[R, L, C]``, weight ``[C, 1, W]`` -> ``[R, L, C]``."""
    w = weight.shape[-1]
    return F.conv1d(F.pad(mixed.transpose(1, 2), (w - 1, 0)), weight, groups=weight.shape[0]).transpose(1, 2)


def _gdn(
    mix: GatedDeltaNet, xi: torch.Tensor, xa: torch.Tensor, ix: _Index, gdn: GdnFn
) -> tuple[torch.Tensor, torch.Tensor]:
    """xi ``[B*n, Ls, D]``, xa ``[B, G, D]`` -> mixer outputs of both streams (same shapes)."""
    bn, ls, d = xi.shape
    b, g_len, _ = xa.shape
    ni = bn * ls
    mixed, z, bb, aa = mix.project(torch.cat([xi.reshape(-1, d), xa.reshape(-1, d)]))
    gate, beta = mix.gates(aa, bb)
    c = mixed.shape[-1]
    mi, ma = mixed[:ni].view(bn, ls, c), mixed[ni:].view(b, g_len, c)
    qkv_i = F.silu(_causal_conv(mi, mix.conv1d.weight))  # [B*n, Ls, C] from a zero conv state
    conv_c = _causal_conv(ix.compose(mi, ma), mix.conv1d.weight)  # [B, L, C]: tails of the bodies before
    qkv_a = F.silu(conv_c[:, ix.active])  # [B, G, C]

    def run(qkv: torch.Tensor, gg: torch.Tensor, bt: torch.Tensor) -> torch.Tensor:
        r, length, _ = qkv.shape
        q, k, v = torch.split(qkv, [mix.key_dim, mix.key_dim, mix.value_dim], dim=-1)
        return gdn(
            q.reshape(r, length, mix.h, mix.dk),
            k.reshape(r, length, mix.h, mix.dk),
            v.reshape(r, length, mix.hv, mix.dv),
            gg.reshape(r, length, mix.hv),
            bt.reshape(r, length, mix.hv),
        )

    gi, ga = gate[:ni].view(bn, ls, mix.hv), gate[ni:].view(b, g_len, mix.hv)
    bi, ba = beta[:ni].view(bn, ls, mix.hv), beta[ni:].view(b, g_len, mix.hv)
    oi = run(qkv_i, gi, bi)  # [B*n, Ls, HV, V]: each segment from a zero state
    oc = run(ix.compose(qkv_i, qkv_a), ix.compose(gi, ga), ix.compose(bi, ba))  # the composed chain
    o = torch.cat([oi.reshape(ni, mix.hv, mix.dv), oc[:, ix.active].reshape(b * g_len, mix.hv, mix.dv)])
    y = mix.output(o, z)
    return y[:ni].view(bn, ls, d), y[ni:].view(b, g_len, d)


def _layer(
    layer: DecoderLayer, hi: torch.Tensor, ha: torch.Tensor, ix: _Index, gdn: GdnFn
) -> tuple[torch.Tensor, torch.Tensor]:
    d = hi.shape[-1]
    x = layer.input_layernorm(torch.cat([hi.reshape(-1, d), ha.reshape(-1, d)]))
    ni = hi.shape[0] * hi.shape[1]
    xi, xa = x[:ni].view(hi.shape), x[ni:].view(ha.shape)
    if layer.linear_attn is not None:
        assert isinstance(layer.linear_attn, GatedDeltaNet), "training runs Gated DeltaNet hybrids only"
        yi, ya = _gdn(layer.linear_attn, xi, xa, ix, gdn)
    else:
        assert layer.self_attn is not None
        yi, ya = _attention(layer.self_attn, xi, xa, ix)
    h = layer.feed_forward(torch.cat([(hi + yi).reshape(-1, d), (ha + ya).reshape(-1, d)]))
    return h[:ni].view(hi.shape), h[ni:].view(ha.shape)


@dataclass
class HypicOut:
    """``final [B, G, D]``: residuals of the active tokens; ``active [G]``: their global positions."""

    final: torch.Tensor
    active: torch.Tensor


def hypic_run(
    model: HybridForCausalLM,
    ids: torch.Tensor,
    plan: SegmentPlan,
    *,
    gdn: GdnFn = chunk_gdn_torch,
    grad_checkpoint: bool = False,
) -> HypicOut:
    """The student over ``ids [B, L]`` (``L == plan.total``) as the ``hypic`` mode composes it."""
    B, L = ids.shape
    if plan.total != L:
        raise ValueError(f"ids hold {L} tokens per row, the plan {plan.total}")
    ix = _Index.build(plan, B, ids.device)
    hi = model.embed(ids[:, : plan.segmented].reshape(B * plan.n_segments, plan.segment_len))
    ha = model.embed(ids[:, ix.active])
    for layer in model.layers:
        if grad_checkpoint and torch.is_grad_enabled():
            hi, ha = checkpoint(_layer, layer, hi, ha, ix, gdn, use_reentrant=False)
        else:
            hi, ha = _layer(layer, hi, ha, ix, gdn)
    return HypicOut(ha, ix.active)
