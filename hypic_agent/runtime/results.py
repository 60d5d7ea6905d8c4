"""What the engine hands back: per-segment usage, timings, streamed events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypic_agent.runtime.state import RequestState


@dataclass
class SegmentUsage:
    id: str | None  # content key (None: not cacheable, e.g. BOS or too short; or split into pieces)
    kind: str
    tokens: int
    hit: bool  # split: every cacheable piece hit
    tier: str | None  # split: the hit pieces' tier, "mixed" when they came from several
    pieces: list[SegmentUsage] = field(default_factory=list)  # split (Settings.split_segment_tokens): per piece


def fold_pieces(usage: Sequence[SegmentUsage], owners: Sequence[int]) -> list[SegmentUsage]:
    """Per-piece usage (``segments.prompt.split``: ``owners[i]`` is piece i's segment) back to one usage per
    segment; a segment of one piece is reported as it is, a split one with its pieces inside."""
    if not owners:
        return list(usage)
    groups: dict[int, list[SegmentUsage]] = {}
    for u, o in zip(usage, owners, strict=True):
        groups.setdefault(o, []).append(u)
    out = []
    for ps in groups.values():
        if len(ps) == 1:
            out.append(ps[0])
            continue
        cached = [p for p in ps if p.id is not None]
        tiers = {p.tier for p in ps if p.hit}
        tier = None if not tiers else tiers.pop() if len(tiers) == 1 else "mixed"
        hit = bool(cached) and all(p.hit for p in cached)
        out.append(SegmentUsage(None, ps[0].kind, sum(p.tokens for p in ps), hit, tier, ps))
    return out


@dataclass
class Prepared:
    """A prompt turned into a ``RequestState``, with how it was built."""

    state: RequestState | None  # None once the scheduler moved it into the state pool
    mode: str
    segments: list[SegmentUsage]
    prompt_tokens: int
    cached_tokens: int  # served from entries that existed before this request (or exact prefix reuse)
    recomputed_tokens: int  # computed for this request: active tokens + cold segment prefill
    exact_prefix_tokens: int = 0  # prefix_cache only: tokens reused as an exact prefix
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class TokenEvent:
    text: str
    token_id: int | None  # None: text released at the end (held back for stop strings), no new token
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None  # (token id, logprob), most likely first


@dataclass
class FinishEvent:
    text: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int
    prepared: Prepared
    ttft_ms: float
    total_ms: float
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


def full_prepared(
    segs: Sequence[Sequence[int]],
    kinds: Sequence[str],
    total: int,
    state: RequestState | None = None,
    timings_ms: dict[str, float] | None = None,
) -> Prepared:
    """How a ``full_recompute`` prompt of ``total`` tokens was built: nothing cached."""
    usage = [SegmentUsage(None, k, len(s), False, None) for s, k in zip(segs, kinds, strict=True)]
    return Prepared(state, "full_recompute", usage, total, 0, total, timings_ms=timings_ms or {})


def prefix_prepared(
    keys: Sequence[str],
    segs: Sequence[Sequence[int]],
    kinds: Sequence[str],
    depth: int,
    reused: int,
    total: int,
    state: RequestState | None = None,
    timings_ms: dict[str, float] | None = None,
) -> Prepared:
    """How a ``prefix_cache`` prompt was built: its first ``depth`` segments (``reused`` tokens) came
    from the prefix cache, the rest was prefilled."""
    usage = [
        SegmentUsage(keys[i], kinds[i], len(s), i < depth, "memory" if i < depth else None) for i, s in enumerate(segs)
    ]
    return Prepared(
        state,
        "prefix_cache",
        usage,
        total,
        reused,
        total - reused,
        exact_prefix_tokens=reused,
        timings_ms=timings_ms or {},
    )
