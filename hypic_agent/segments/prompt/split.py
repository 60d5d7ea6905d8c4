"""Long segments cut into fixed-length pieces: the unit the cache keys, builds and seams.

A request's segments are the user's (what ids, registry rows and the response's per-segment usage
name); a piece is the cache's. ``split_segments`` cuts every segment longer than ``length`` tokens
into pieces of ``length`` tokens counted from its start (the last one shorter), which downstream
are segments in their own right: each has its own content key, so a repeated long document hits
every piece and two documents that share a prefix share the pieces lying wholly inside it (pieces
are cut from the start, never balanced over the length, so a piece's tokens do not depend on what
follows it); each is a cold build of its own (spread over the scatter workers; in the fused build
the attention cost is a sum of ``length**2`` rather than one ``n**2``); each has its seam recomputed
in context, which is the only difference splitting makes to the answer: a split document is
answered exactly as if its pieces had been sent as separate segments. ``owners`` maps each piece
back to its segment, for the usage reported per segment. Pure: no model, no torch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """Pieces (token ids) with their segment's kind, and per piece the index of that segment."""

    segs: list[tuple[int, ...]]
    kinds: list[str]
    owners: tuple[int, ...]

    @property
    def was_split(self) -> bool:
        """Some segment became more than one piece."""
        return len(self.owners) > len(set(self.owners))


def split_ids(ids: Sequence[int], length: int) -> list[tuple[int, ...]]:
    """``ids`` in pieces of ``length`` tokens from the start (the last shorter); whole if ``length`` is
    0 or the segment is not longer than it."""
    ids = tuple(ids)
    if length <= 0 or len(ids) <= length:
        return [ids]
    return [ids[a : a + length] for a in range(0, len(ids), length)]


def split_segments(
    segs: Sequence[Sequence[int]], kinds: Sequence[str], length: int, *, keep: Collection[str] = ("bos",)
) -> Split:
    """Every segment whose kind is not in ``keep`` cut by ``split_ids``; pieces in prompt order."""
    if len(segs) != len(kinds):
        raise ValueError(f"{len(segs)} segments but {len(kinds)} kinds")
    out: list[tuple[int, ...]] = []
    out_kinds: list[str] = []
    owners: list[int] = []
    for i, (s, kind) in enumerate(zip(segs, kinds, strict=True)):
        pieces = [tuple(s)] if kind in keep else split_ids(s, length)
        out += pieces
        out_kinds += [kind] * len(pieces)
        owners += [i] * len(pieces)
    return Split(out, out_kinds, tuple(owners))
