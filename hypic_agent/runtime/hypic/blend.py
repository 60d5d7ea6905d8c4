"""``seam="blend"``: scattered body recompute under the seam budget (CacheBlend's idea, for hybrids).

Seams recompute the first tokens of every segment; past the sink token the deviation of a model not
trained for cached prefill sits inside the bodies (``benchmarks/deviation.py``), where seams do not
reach. ``blend`` spends the same budget (``Settings.seam_budget``: a share of the cacheable
segments' tokens) on the individual tokens predicted to deviate most, wherever they are.

**Token profile (measured once per segment, at its first sight).** As ``auto_seams.measure_profile``
but over the whole segment: each token's layer inputs alone vs after a fixed neutral context
(``auto_seams.PROXY_TEXT``), relative error averaged over layers. It costs one extra prefill of the
segment (plus the short context), paid once like the entry itself, and keeps no per-layer rows
(the two forwards run in lockstep, layer by layer). CacheBlend selects at the combine instead (one
layer recomputed for every token, then the top keys / values by deviation); on SmolLM2 the
build-time profile selected as well (first-token KL at equal tokens within a few thousandths,
``docs/benchmarks.md``) without that layer, which would cost 1/30 of the prompt on its own, and a
hybrid's linear layers could not run it for tokens in a body.

**Allocation (per request, deterministic).** The budget's tokens go to the highest-deviation tokens
over all cacheable segments (ties: earlier segment, then earlier offset). A segment's selected run
from offset 0 becomes its seam (recomputed exactly, as a fixed seam); the rest are its *blend*
offsets (``layout.plan_layout(blend=...)``). A hybrid's non-zero seam covers the conv window
(``floor`` tokens). A segment with nothing before it (the first) predicts no deviation: its tokens
go last, so a budget of 1 recomputes every segment whole (``full_recompute``).

**What is exact.** Attention layers: a blend token's keys / values are recomputed in context and
replace the cached rows; on an attention-only model (SmolLM2) it is recomputed exactly like a seam
token. Linear layers: see ``blend_rows`` (the chain stays the pair-composed one; a blend token's
own output runs from the state entering its body, approximate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.runtime.hypic.auto_seams import ProfileTable, SeamProfile
from hypic_agent.runtime.hypic.combine import _attention, _linear
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.layout import CombineLayout, plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.models.hybrid import HybridForCausalLM

BLEND = "blend"
KEY_PREFIX = "blend:"  # token profiles share the auto profiles' table under their own keys


@dataclass(frozen=True)
class BlendPlan:
    seams: list[int]  # recomputed head per segment (its length: the whole segment)
    offsets: list[list[int]]  # body offsets recomputed as well, ascending, per segment

    def tokens(self) -> int:
        return sum(self.seams) + sum(len(o) for o in self.offsets)


def _rows(model: HybridForCausalLM, lay: CombineLayout) -> Any:
    """The residual entering every layer of a no-entry layout (``probe``'s forward), one at a time."""
    spec = mode_spec("hypic")
    inputs = combine_inputs(model, lay, [None], spec.transition, fused_scan=False)
    h = model.embed(lay.active_ids)
    for li, layer in enumerate(model.layers):
        yield h
        xs = layer.mixer_in(h)
        if layer.linear_attn is not None:
            o, _ = _linear(layer.linear_attn, xs, lay, [None], li, spec, None, None, None, inputs.kernels)
            extra: tuple[torch.Tensor, ...] = xs[1:2]
        else:
            assert layer.self_attn is not None
            q, k, v = xs[:3]
            o, _ = _attention(layer.self_attn, q, k, v, lay, [None], li, spec, None)
            extra = xs[3:]
        h = layer.mixer_out(h, o, *extra)
    yield h


@torch.no_grad()
def measure_tokens(model: HybridForCausalLM, tokens: Sequence[int], context: Sequence[int]) -> SeamProfile:
    """Every token's predicted deviation (see module doc), as a ``SeamProfile`` over the whole segment."""
    dev = next(model.parameters()).device
    alone = _rows(model, plan_layout([tuple(tokens)], [None], [0], [], dev))
    after = _rows(model, plan_layout([(*context, *tokens)], [None], [0], [], dev))
    err = torch.zeros(len(tokens), dtype=torch.float64, device=dev)
    n = 0
    for li, (a, b) in enumerate(zip(alone, after, strict=True)):
        if li == 0:  # the embeddings: equal in both runs
            continue
        ref = b[len(context) :].float()
        err += ((a.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).double()
        n += 1
    return SeamProfile(tuple((err / max(1, n)).tolist()), 0.0)


def allocate_tokens(
    lengths: Sequence[int], profiles: Sequence[SeamProfile | None], budget_tokens: int, floor: int = 0
) -> BlendPlan:
    """Seams and blend offsets per segment (``lengths``) for at most ``budget_tokens`` tokens;
    ``profiles[i]`` None: not cacheable (no budget, seam 0); ``floor``: the smallest non-zero seam."""
    cand = sorted(
        (-(p.dev[j] if j < len(p.dev) else p.tail), i, j)
        for i, (n, p) in enumerate(zip(lengths, profiles, strict=True))
        if p is not None
        for j in range(n)
    )
    chosen: list[set[int]] = [set() for _ in lengths]
    left = budget_tokens
    for _, i, j in cand:
        if j in chosen[i]:
            continue
        add = {j} if j > 0 or floor <= 1 else set(range(min(floor, lengths[i]))) - chosen[i]
        if len(add) > left:
            continue  # a smaller one may still fit
        chosen[i] |= add
        left -= len(add)
        if left == 0:
            break
    seams, offsets = [], []
    for n, picked in zip(lengths, chosen, strict=True):
        w = 0
        while w < n and w in picked:
            w += 1
        seams.append(w)
        offsets.append(sorted(j for j in picked if j >= w))
    return BlendPlan(seams, offsets)


def plan_blend(
    model: HybridForCausalLM,
    table: ProfileTable,
    tokenizer: Any,
    segs: Sequence[Sequence[int]],
    keys: Sequence[str | None],
    budget: float,
) -> BlendPlan:
    """A request's blend plan (``keys[i]`` None: not cacheable, recomputed whole); measures the token
    profiles it has not seen (the caller holds the model)."""
    ctx = table.context(tokenizer)
    profiles: list[SeamProfile | None] = []
    for i, (s, k) in enumerate(zip(segs, keys, strict=True)):
        if k is None:
            profiles.append(None)
        elif i == 0:  # nothing before it in the prompt: cached rows are exact
            profiles.append(SeamProfile((), 0.0))
        else:
            p = table.get(KEY_PREFIX + k)
            if p is None:
                p = measure_tokens(model, s, ctx)
                table.put(KEY_PREFIX + k, p)
            profiles.append(p)
    total = sum(len(s) for s, k in zip(segs, keys, strict=True) if k is not None)
    cfg = model.config
    floor = cfg.linear_conv_kernel_dim - 1 if "linear" in cfg.layer_types else 0
    return allocate_tokens([len(s) for s in segs], profiles, int(budget * total + 1e-9), floor)
