"""A prompt plan validated for the engine: ``PromptPieces`` (segments, kinds, suffix, mode, seam).

The edge (``api/service.py``, the CLI, the SDK's server) builds a ``segments.prompt.plan.PromptPlan``; the
engine checks it once here (``make_pieces``: not empty, inside the context window, a known mode and
a valid seam) and every later stage (scheduler, cold builds, combine) takes the pieces as they are.
Composed modes with ``Settings.split_segment_tokens`` cut long segments into pieces here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hypic_agent.errors import ContextLengthError, InvalidRequestError
from hypic_agent.runtime.hypic.modes import ModeSpec
from hypic_agent.segments.prompt.split import Split, split_segments


class PlanLike(Protocol):
    """What the engine reads of a ``segments.prompt.plan.PromptPlan``."""

    @property
    def segments(self) -> Sequence[Any]: ...  # each with .token_ids and .kind

    @property
    def suffix_ids(self) -> Sequence[int]: ...

    @property
    def bos_id(self) -> int | None: ...


@dataclass(frozen=True)
class PromptPieces:
    """A validated prompt: segments (BOS first, if any) with their kinds, the suffix, the mode.

    Composed modes with ``Settings.split_segment_tokens``: ``segs`` are the pieces of the plan's
    segments (``segments.prompt.split``), ``owners`` per piece the index of its segment (BOS counted);
    empty: one piece per segment."""

    segs: list[tuple[int, ...]]
    kinds: list[str]
    suffix: list[int]
    spec: ModeSpec
    w: float | str  # a fixed seam, "auto" (``auto_seams``) or "blend" (``hypic.blend``)
    total: int  # prompt tokens
    owners: tuple[int, ...] = ()


def id_tuple(ids: Sequence[int]) -> tuple[int, ...]:
    """Token ids as a tuple of ints; a tuple (what ``segments.prompt.plan`` builds) is taken as it is: a
    RAG prompt's 20k ids cost ~1 ms to convert one by one."""
    return ids if type(ids) is tuple else tuple(map(int, ids))


def split_for(segs: Sequence[Sequence[int]], kinds: Sequence[str], spec: ModeSpec, split_tokens: int) -> Split | None:
    """Composed modes: the segments cut into pieces of ``split_tokens`` (None: nothing cut)."""
    if not spec.composed or not split_tokens:
        return None
    cut = split_segments(segs, kinds, split_tokens)
    return cut if cut.was_split else None


def make_pieces(
    plan: PlanLike, spec: ModeSpec, w: float | str, *, max_context: int, max_new_tokens: int, split_tokens: int
) -> PromptPieces:
    """``plan`` checked and split into cacheable segments and the suffix (no model work): raises
    ``InvalidRequestError`` (empty) or ``ContextLengthError`` (prompt + ``max_new_tokens`` past
    ``max_context``). Without a query the last segment becomes the suffix."""
    segs = [id_tuple(s.token_ids) for s in plan.segments]
    kinds = [str(getattr(s, "kind", "text")) for s in plan.segments]
    suffix = [int(t) for t in plan.suffix_ids]
    if plan.bos_id is not None:
        segs.insert(0, (int(plan.bos_id),))
        kinds.insert(0, "bos")
    total = sum(len(s) for s in segs) + len(suffix)
    if total == 0:
        raise InvalidRequestError("the prompt is empty", param="segments")
    if total + max_new_tokens > max_context:
        raise ContextLengthError(
            f"prompt ({total} tokens) + max_tokens ({max_new_tokens}) exceeds the context window "
            f"({max_context}); send fewer segments or lower max_tokens",
            param="segments",
        )
    if not suffix:  # no query: the last segment is computed as the suffix
        suffix = list(segs.pop())
        kinds.pop()
    cut = split_for(segs, kinds, spec, split_tokens)
    if cut is not None:
        return PromptPieces(cut.segs, cut.kinds, suffix, spec, w, total, cut.owners)
    return PromptPieces(segs, kinds, suffix, spec, w, total)
