"""``seam="blend"``: scattered body recompute under the seam budget (CacheBlend's idea, for hybrids).

Seams recompute the first tokens of every segment; past the sink token the deviation of a model not
trained for cached prefill sits inside the bodies (``benchmarks/deviation.py``), where seams do not
reach. ``blend`` spends the budget (``Settings.seam_budget``: a share of the cacheable segments'
tokens, as for ``auto``) on the body tokens that matter most to this request, wherever they are.

**Token profile (once per segment, at its first sight).** As ``auto_seams.measure_profile`` but over
the whole segment: each token's layer inputs alone vs after a fixed neutral context
(``auto_seams.PROXY_TEXT``), relative error averaged over layers: how far its cached rows are from
what any context would give. One extra prefill of the segment, paid once like the entry; the two
forwards run in lockstep and keep no per-layer rows.

**Two stages per request.**

1. Before the entries (their keys carry the seam): every cacheable segment but the first gets the
   *sink seam* (1 token; a hybrid's ``floor``, the conv window), highest offset-0 deviation first
   while the budget lasts. The rest of the budget, less the scout's cost, is the number of body
   tokens to pick (``BlendPlan.tokens``).
2. With the entries (``BlendPlan.pick``): the scout (``blend_scout``) runs the seams and the suffix
   over the cached bodies through the first quarter of the layers (``SCOUT_LAYERS``; at least to
   the first attention layer) and sums the attention the suffix gives every position; a body
   token's score is that mass times its profile deviation. The top ``tokens`` scores (ties: earlier
   position) are the blend offsets (``layout.plan_layout``). Where the scout would cost more than
   the tokens it picks (a small budget, a long question), there is none and the deviation alone
   picks.

The deviation alone (question-blind, what CacheBlend's layer-1 key/value deviation also measures)
picked tokens that lowered the first-token KL but not the gold-answer NLL (CHANGELOG.md, "Benchmark
history"); weighting by the question's attention is what made the picks count. The scout's rows are charged
to the budget: ``active rows x scout layers / layers`` token equivalents. A deeper scout reads the
question better but costs more: on SmolLM2 at w=8's token count, 8 of 30 layers left the lowest
first-token KL (4 and 15 within noise, all 30 clearly worse: its cost ate a third of the budget).

A budget covering every cacheable token recomputes every segment whole (``full_recompute``). What is
exact: attention layers recompute a blend token's keys / values in context and replace the cached
rows (on an attention-only model such a token is recomputed exactly like a seam token); linear
layers keep the pair chain and approximate the blend token's own output (``blend_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.runtime.hypic.auto_seams import ProfileTable, SeamProfile, segment_profiles
from hypic_agent.runtime.hypic.blend_scout import scout_mass
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout, plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.hypic.probe import probe
from hypic_agent.runtime.models.hybrid import HybridForCausalLM

BLEND = "blend"
KEY_PREFIX = "blend:"  # token profiles share the auto profiles' table under their own keys
SCOUT_LAYERS = 0.25  # share of the layers the scout runs (first ones)


@dataclass(frozen=True)
class BlendPlan:
    """Stage 1 of a request's blend (see module doc)."""

    seams: list[int]  # recomputed head per segment (its length: the whole segment)
    profiles: list[SeamProfile | None]  # per segment (None: not cacheable)
    tokens: int  # body tokens ``pick`` chooses
    scout_layers: int  # layers the scout runs (0: no scout)
    scout_rows: int  # its active rows (seams, uncached segments, suffix)
    n_layers: int

    def recomputed(self, cached: Sequence[bool]) -> float:
        """Tokens computed in context besides the suffix, in token equivalents: seams of the cached
        segments (``cached[i]``), picked body tokens, the scout."""
        seams = sum(w for w, c in zip(self.seams, cached, strict=True) if c)
        return seams + self.tokens + self.scout_rows * self.scout_layers / max(1, self.n_layers)

    def pick(
        self,
        model: HybridForCausalLM,
        segs: Sequence[Sequence[int]],
        entries: list[SegmentEntry | None],
        suffix: list[int],
    ) -> list[list[int]]:
        """Body offsets per segment (stage 2): the top ``tokens`` of scout mass x deviation."""
        out: list[list[int]] = [[] for _ in segs]
        if not self.tokens:
            return out
        total = sum(map(len, segs)) + len(suffix)
        mass = torch.ones(total)  # no scout: the deviation alone
        if self.scout_layers:
            lay = plan_layout(list(map(tuple, segs)), entries, self.seams, suffix, next(model.parameters()).device)
            mass = scout_mass(model, lay, entries, len(suffix), self.scout_layers).cpu()
            if not mass.any():  # no attention layer read (MLA only)
                mass = torch.ones_like(mass)
        score = torch.full((total,), -1.0)
        at = 0
        for s, w, e, p in zip(segs, self.seams, entries, self.profiles, strict=True):
            if e is not None and p is not None and w < len(s):
                d = torch.tensor([p.dev[j] if j < len(p.dev) else p.tail for j in range(w, len(s))])
                score[at + w : at + len(s)] = mass[at + w : at + len(s)] * d
            at += len(s)
        order = torch.sort(-score, stable=True).indices[: self.tokens]
        chosen = sorted(int(x) for x in order if score[x] >= 0)
        starts = [0]
        for s in segs:
            starts.append(starts[-1] + len(s))
        for pos in chosen:
            i = next(k for k in range(len(segs)) if starts[k + 1] > pos)
            out[i].append(pos - starts[i])
        return out


def _rows(model: HybridForCausalLM, lay: CombineLayout) -> list[torch.Tensor]:
    """The residual entering every layer of a no-entry layout, and after the last (``probe``)."""
    return list(probe(model, lay, [None], mode_spec("hypic"), logits=False).hidden)


@torch.no_grad()
def measure_tokens(
    model: HybridForCausalLM, tokens: Sequence[int], context: Sequence[int], build: Sequence[int] = ()
) -> SeamProfile:
    """Every token's predicted deviation (see module doc), as a ``SeamProfile`` over the whole segment;
    ``build``: the build context the entry's rows follow (``auto_seams.measure_profile``)."""
    dev = next(model.parameters()).device
    lead = (*build, *context)
    alone = _rows(model, plan_layout([(*build, *tokens)], [None], [0], [], dev))
    after = _rows(model, plan_layout([(*lead, *tokens)], [None], [0], [], dev))
    err = torch.zeros(len(tokens), dtype=torch.float64, device=dev)
    n = 0
    for li, (a, b) in enumerate(zip(alone, after, strict=True)):
        if li == 0:  # the embeddings: equal in both runs
            continue
        ref = b[len(lead) :].float()
        err += ((a[len(build) :].float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)).double()
        n += 1
    return SeamProfile(tuple((err / max(1, n)).tolist()), 0.0)


def sink_seams(
    lengths: Sequence[int], profiles: Sequence[SeamProfile | None], budget_tokens: int, width: int
) -> list[int]:
    """Seam ``width`` (or the whole of a shorter segment) for the segments with a positive offset-0
    deviation, highest first (ties: the earlier one), while ``budget_tokens`` lasts."""
    seams = [0] * len(lengths)
    first = [(-(p.dev[0] if p.dev else p.tail), i) for i, p in enumerate(profiles) if p is not None]
    left = budget_tokens
    for neg, i in sorted(first):
        w = min(width, lengths[i])
        if neg < 0 and w <= left:
            seams[i], left = w, left - w
    return seams


def plan_blend(
    model: HybridForCausalLM,
    table: ProfileTable,
    tokenizer: Any,
    segs: Sequence[Sequence[int]],
    keys: Sequence[str | None],
    budget: float,
    n_suffix: int,
    build: Sequence[int] = (),
) -> BlendPlan:
    """Stage 1 of a request's blend (``keys[i]`` None: not cacheable, recomputed whole); measures the
    token profiles it has not seen (the caller holds the model); ``build``: the build context's tokens."""
    profiles = segment_profiles(model, table, tokenizer, segs, keys, measure_tokens, KEY_PREFIX, build)
    lengths = [len(s) for s in segs]
    n_layers = len(model.layers)
    cached = [p is not None for p in profiles]
    total = sum(n for n, c in zip(lengths, cached, strict=True) if c)
    budget_tokens = int(budget * total + 1e-9)
    if budget_tokens >= total:  # every segment whole: full_recompute
        return BlendPlan(lengths, profiles, 0, 0, 0, n_layers)
    cfg = model.config
    width = max(1, cfg.linear_conv_kernel_dim - 1 if "linear" in cfg.layer_types else 1)
    seams = sink_seams(lengths, profiles, budget_tokens, width)
    rows = sum(w if c else n for n, w, c in zip(lengths, seams, cached, strict=True)) + n_suffix
    first_attn = next((i for i, layer in enumerate(model.layers) if layer.self_attn is not None), 0)
    layers = max(1, math.ceil(SCOUT_LAYERS * n_layers), first_attn + 1)  # at least one attention layer
    scout = rows * layers / n_layers
    body = sum(n - w for n, w, c in zip(lengths, seams, cached, strict=True) if c)
    left = budget_tokens - sum(seams)
    tokens = min(body, math.floor(left - scout))
    if tokens < scout:  # the scout would cost more than it picks: the deviation alone picks
        return BlendPlan(seams, profiles, min(body, left), 0, 0, n_layers)
    return BlendPlan(seams, profiles, tokens, layers, rows, n_layers)
