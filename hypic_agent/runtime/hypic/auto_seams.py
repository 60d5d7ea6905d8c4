"""``seam="auto"``: each segment's seam width chosen under a recompute budget.

A fixed seam gives every segment the same ``w``. Deviation is not spread that evenly
(``benchmarks/deviation.py``): a segment at the very start of the prompt is exact without any
seam, and segments differ in how much their first tokens depend on what came before them.

**Profile (measured once per segment, at its first sight).** The segment's first
``PROFILE_TOKENS`` tokens run twice: alone (as its entry caches them) and after a fixed neutral
context (``PROXY_TEXT``). ``dev[t]`` is the relative error of token ``t``'s residual stream
between the two runs, averaged over the layers' inputs: how much that token's cached keys /
values (a hybrid's pair inputs) move once something precedes the segment. Beyond the measured
tokens the profile continues at the mean of its last quarter. Profiles are deterministic
functions of the model and the tokens; ``ProfileTable`` keeps them by content key.

With a build context (``Settings.build_prefix``) an entry caches the rows the segment has *after the
context*, so both runs start with the context's tokens (``build``): the cached run is ``[build |
segment]``, the other ``[build | PROXY_TEXT | segment]``. The first segment of a prompt is
built in isolation under any context (``SeamPlanner.entry_key``: nothing precedes it, so its isolated
rows are exact) and keeps its zero profile.

**Allocation (per request).** The budget is ``budget * (tokens of the cacheable segments)`` seam
tokens. Seams grow along ``LADDER`` (0, 2, 4, 8, 12, 16, 24, 32, 48, 64, ... then the whole
segment); greedily, the step with the largest predicted deviation removed per token
(``sum dev[a:b] / (b - a)``) that still fits is taken; ties go to the earlier segment. A segment
with nothing before it in the prompt gets zero gain (its cached rows are exact): it is recomputed
only whole, once the budget covers every other segment. A seam that
reaches the segment's length recomputes it whole (no entry), so a budget of 1 is
``full_recompute``. Widths are absolute token counts, so an ``auto`` segment at width 8 shares the
entry of fixed ``seam=8``.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.hypic.probe import probe
from hypic_agent.runtime.models.hybrid import HybridForCausalLM

AUTO = "auto"
PROFILE_TOKENS = 64
PROXY_TEXT = (
    "The following passage is one of several documents collected for a question. "
    "Read it carefully together with the others.\n\n"
)
LADDER = (0, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def ladder_steps(n: int, floor: int = 0) -> list[int]:
    """Seam widths a segment of ``n`` tokens may take, ascending, ending at ``n`` (whole segment):
    ``LADDER`` then doubling; no width in ``(0, floor)`` (a hybrid's seam covers the conv window)."""
    out = [w for w in LADDER if w < n and (w == 0 or w >= floor)]
    w = LADDER[-1] * 2
    while w < n:
        out.append(w)
        w *= 2
    return [*out, n]


@dataclass(frozen=True)
class SeamProfile:
    """Predicted deviation per token offset (``dev``, the first measured tokens) and past them (``tail``)."""

    dev: tuple[float, ...]
    tail: float

    def gain(self, a: int, b: int) -> float:
        """Predicted deviation of tokens ``a..b-1`` (what recomputing them removes)."""
        m = len(self.dev)
        head = sum(self.dev[a:b]) if a < m else 0.0
        return head + self.tail * max(0, b - max(a, m))


@torch.no_grad()
def measure_profile(
    model: HybridForCausalLM, tokens: Sequence[int], context: Sequence[int], build: Sequence[int] = ()
) -> SeamProfile:
    """``tokens``' first ``PROFILE_TOKENS`` as cached (alone, or after the build context ``build``) vs
    with ``context`` ahead of them as well (see module doc)."""
    head = list(tokens[:PROFILE_TOKENS])
    dev = next(model.parameters()).device
    spec = mode_spec("hypic")

    def rows(lead: Sequence[int]) -> torch.Tensor:  # [n_layers + 1, t, D]: the head's layer inputs after lead
        lay = plan_layout([(*lead, *head)], [None], [0], [], dev)
        return probe(model, lay, [None], spec, logits=False).hidden[:, len(lead) :]

    alone, after = rows(build), rows((*build, *context))  # as cached, and with more ahead
    ref = after[1:].float()  # layer inputs past the embeddings (equal in both runs)
    err = (alone[1:].float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)  # [n_layers, t]
    d = err.mean(0).tolist()
    q = d[-max(1, len(d) // 4) :]
    return SeamProfile(tuple(d), sum(q) / len(q))


def allocate(
    lengths: Sequence[int], profiles: Sequence[SeamProfile | None], budget_tokens: int, floor: int = 0
) -> list[int]:
    """Seam width per segment (``lengths``), at most ``budget_tokens`` in total; ``profiles[i]``
    None: the segment takes no budget (not cacheable: it is recomputed whole anyway) and gets 0;
    ``floor``: the smallest non-zero width (``ladder_steps``). Deterministic (ties: the earlier
    segment)."""
    widths = [0] * len(lengths)
    # a segment with nothing to gain is only ever recomputed whole (budget to spare)
    steps = [
        [0] if p is None else ladder_steps(n, floor) if p.gain(0, n) > 0 else [0, n]
        for n, p in zip(lengths, profiles, strict=True)
    ]
    pos = [0] * len(lengths)  # index into steps[i] of the current width
    heap: list[tuple[float, int, int]] = []

    def push(i: int) -> None:
        if pos[i] + 1 < len(steps[i]):
            a, b = steps[i][pos[i]], steps[i][pos[i] + 1]
            p = profiles[i]
            assert p is not None
            heapq.heappush(heap, (-p.gain(a, b) / (b - a), i, b - a))

    for i in range(len(lengths)):
        push(i)
    left = budget_tokens
    while heap:
        _, i, cost = heapq.heappop(heap)
        if cost > left:  # does not fit (this segment stops growing): another segment's smaller step may
            continue
        left -= cost
        pos[i] += 1
        widths[i] = steps[i][pos[i]]
        push(i)
    return widths


class ProfileTable:
    """Profiles by segment content key, most recently used kept (``max_items``); thread-safe."""

    def __init__(self, max_items: int = 100_000) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, SeamProfile] = OrderedDict()
        self._lock = threading.Lock()
        self._context: tuple[int, ...] | None = None

    def context(self, tokenizer: Any) -> tuple[int, ...]:
        """``PROXY_TEXT``'s token ids (tokenized once)."""
        if self._context is None:
            try:
                ids = tokenizer.encode(PROXY_TEXT, add_special_tokens=False)
            except TypeError:  # tokenizers without the keyword
                ids = tokenizer.encode(PROXY_TEXT)
            self._context = tuple(int(t) for t in ids)
        return self._context

    def get(self, key: str) -> SeamProfile | None:
        with self._lock:
            p = self._items.get(key)
            if p is not None:
                self._items.move_to_end(key)
            return p

    def put(self, key: str, profile: SeamProfile) -> None:
        with self._lock:
            self._items[key] = profile
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


# (model, tokens, context, build) -> profile: ``tokens`` after ``build`` (as cached) vs after ``build + context``
Measure = Callable[[HybridForCausalLM, Sequence[int], Sequence[int], Sequence[int]], SeamProfile]


def segment_profiles(
    model: HybridForCausalLM,
    table: ProfileTable,
    tokenizer: Any,
    segs: Sequence[Sequence[int]],
    keys: Sequence[str | None],
    measure: Measure,
    prefix: str = "",
    build: Sequence[int] = (),
) -> list[SeamProfile | None]:
    """Each segment's profile (None: not cacheable; the first: exact, nothing before it, and built in
    isolation under any build context), from ``table`` under ``prefix + key`` or measured by ``measure``
    against the table's context after ``build`` (the build context's tokens) and kept."""
    ctx = table.context(tokenizer)
    profiles: list[SeamProfile | None] = []
    for i, (s, k) in enumerate(zip(segs, keys, strict=True)):
        if k is None:
            profiles.append(None)
        elif i == 0:  # nothing before it in the prompt: cached rows are exact
            profiles.append(SeamProfile((), 0.0))
        else:
            p = table.get(prefix + k)
            if p is None:
                p = measure(model, s, ctx, build)
                table.put(prefix + k, p)
            profiles.append(p)
    return profiles


def plan_seams(
    model: HybridForCausalLM,
    table: ProfileTable,
    tokenizer: Any,
    segs: Sequence[Sequence[int]],
    keys: Sequence[str | None],
    budget: float,
    build: Sequence[int] = (),
) -> list[int]:
    """Seam widths of a request's segments (``keys[i]`` None: not cacheable, recomputed whole);
    measures the profiles it has not seen (the caller holds the model). ``build``: the build
    context's tokens, which the entries are prefilled after (their keys, and so the profiles', carry
    its tag)."""
    profiles = segment_profiles(model, table, tokenizer, segs, keys, measure_profile, build=build)
    total = sum(len(s) for s, k in zip(segs, keys, strict=True) if k is not None)
    cfg = model.config
    floor = cfg.linear_conv_kernel_dim - 1 if "linear" in cfg.layer_types else 0  # conv window of the pieces
    return allocate([len(s) for s in segs], profiles, int(budget * total + 1e-9), floor)
