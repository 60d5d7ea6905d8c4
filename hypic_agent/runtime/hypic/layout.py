"""``CombineLayout``: where every token of a composed prompt comes from.

The prompt is ``[segment 0][segment 1]...[segment m-1][suffix]``. Each segment is either served
from an entry (its first ``seam`` tokens are *active*, i.e. recomputed in context, the rest is
the cached *body*) or has no entry (all tokens active). The suffix is always active. Active
tokens form maximal contiguous *pieces*; the linear-layer chain alternates pieces and bodies.
All index tensors are computed once per request and shared by every layer.

``blend`` (``seam="blend"``, ``runtime.hypic.blend``) adds scattered *body* tokens to the active
set: they are active rows in prompt order like the others, but no piece holds them (the body's
cached rows and pair still cover them; attention layers overwrite their rows with the fresh ones).
``piece_rows`` / ``blend_rows`` index the two kinds of active rows (None without blend tokens:
every active row is in a piece).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import torch

from hypic_agent.kernels._varlen import concat_ranges
from hypic_agent.kernels.backend import to_device_async
from hypic_agent.runtime.hypic.entry import SegmentEntry


@dataclass
class ChainItem:
    kind: str  # "piece" | "body"
    index: int  # piece number, or segment number for a body


@dataclass
class CombineLayout:
    total: int  # prompt length L
    active_ids: torch.Tensor  # [Ta] token ids of active tokens
    active_pos: torch.Tensor  # [Ta] global positions
    cu_pieces: torch.Tensor  # [P+1] int32 over active tokens
    cu_host: list[int]  # the same bounds on the host
    body_pos: torch.Tensor  # [Tb] global positions of body tokens
    body_local_pos: torch.Tensor  # [Tb] positions inside their segment (canonical rotation)
    body_segments: list[int]  # segments with a non-empty body, in order
    body_lens: list[int]  # body length of each of those segments
    chain: list[ChainItem]  # pieces and bodies in prompt order
    piece_conv_from: list[int | None]  # per piece: segment whose body precedes it (conv tail), or None
    all_pos: torch.Tensor  # [L] 0..L-1 (key positions of the spliced KV)
    # [P] int64: each piece's index in ``chain`` (on the device with the rest: a combine CUDA graph
    # cannot upload it while it is captured)
    piece_slots: torch.Tensor
    tokens: list[int] = field(default_factory=list)  # all prompt tokens
    body_starts: list[int] = field(default_factory=list)  # global position of each body's first token (host)
    # what every tensor above except active_ids follows from: per segment (length, active head or -1
    # without an entry), then the suffix length; equal keys give equal layouts up to the token ids
    shape_key: tuple[int, ...] = ()
    segment_starts: list[int] = field(default_factory=list)  # global position of every segment's first token
    piece_rows: torch.Tensor | None = None  # [Tp] active rows in pieces (None: all of them)
    blend_rows: torch.Tensor | None = None  # [Tx] active rows inside bodies (None: none)
    blend_pos: list[int] = field(default_factory=list)  # their global positions (host)
    # per body holding blend rows: (its index in ``chain``, first and end blend row); the rows of one
    # body are consecutive among the blend rows (prompt order)
    blend_groups: list[tuple[int, int, int]] = field(default_factory=list)


def plan_layout(
    segments: list[tuple[int, ...]],
    entries: list[SegmentEntry | None],
    seams: list[int],
    suffix: list[int],
    device: torch.device,
    blend: Sequence[Sequence[int]] | None = None,
) -> CombineLayout:
    """``seams[i]``: active head of segment i when it has an entry (ignored otherwise); ``blend[i]``:
    offsets in segment i's body (``>= seams[i]``, ascending) recomputed as well (ignored without an
    entry)."""
    active_ids: list[int] = []
    active_spans: list[tuple[int, int]] = []
    piece_lens: list[int] = []
    body_spans: list[tuple[int, int]] = []
    local_spans: list[tuple[int, int]] = []
    body_segments: list[int] = []
    body_lens: list[int] = []
    chain: list[ChainItem] = []
    conv_from: list[int | None] = []
    tokens: list[int] = []
    starts: list[int] = []
    kinds: list[bool] = []  # per active row: in a piece (True) or a blend row inside a body
    blend_pos: list[int] = []
    groups: list[tuple[int, int, int]] = []
    offset = 0
    prev_body: int | None = None
    in_piece = False

    def add_active(ids: tuple[int, ...] | list[int], start: int) -> None:
        nonlocal in_piece
        if not ids:
            return
        if not in_piece:
            chain.append(ChainItem("piece", len(piece_lens)))
            piece_lens.append(0)
            conv_from.append(prev_body)
            in_piece = True
        active_ids.extend(ids)
        active_spans.append((start, start + len(ids)))
        piece_lens[-1] += len(ids)
        kinds.extend([True] * len(ids))

    shape_key: list[int] = []
    for i, seg in enumerate(segments):
        n = len(seg)
        e = entries[i]
        w = n if e is None else min(seams[i], n)
        shape_key += [n, -1 if e is None else w]
        starts.append(offset)
        add_active(seg[:w], offset)
        extra = [j for j in (blend[i] if blend is not None and e is not None else ()) if w <= j < n]
        if extra:
            assert all(a < b for a, b in pairwise(extra)), "blend offsets must ascend"
            active_ids.extend(seg[j] for j in extra)
            active_spans.extend((offset + j, offset + j + 1) for j in extra)
            groups.append((len(chain), len(blend_pos), len(blend_pos) + len(extra)))  # the body comes next
            blend_pos.extend(offset + j for j in extra)
            kinds.extend([False] * len(extra))
        if w < n:
            body_segments.append(i)
            body_lens.append(n - w)
            body_spans.append((offset + w, offset + n))
            local_spans.append((w, n))
            chain.append(ChainItem("body", i))
            prev_body = i
            in_piece = False
        tokens.extend(seg)
        offset += n
    add_active(list(suffix), offset)
    tokens.extend(suffix)
    offset += len(suffix)
    key = (*shape_key, len(suffix))
    rows: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    if blend_pos:  # the offsets are part of the layout (a graph of it reads those rows)
        key = (*key, -2, *blend_pos)
        flags = torch.tensor(kinds)
        rows = (to_device_async(flags.nonzero()[:, 0], device), to_device_async((~flags).nonzero()[:, 0], device))
    cu_host = [0]
    for n in piece_lens:
        cu_host.append(cu_host[-1] + n)
    return CombineLayout(
        total=offset,
        active_ids=to_device_async(torch.tensor(active_ids, dtype=torch.long), device),
        active_pos=to_device_async(torch.from_numpy(concat_ranges(active_spans)), device),
        cu_pieces=to_device_async(torch.tensor(cu_host, dtype=torch.int32), device),
        cu_host=cu_host,
        body_pos=to_device_async(torch.from_numpy(concat_ranges(body_spans)), device),
        body_local_pos=to_device_async(torch.from_numpy(concat_ranges(local_spans)), device),
        body_segments=body_segments,
        body_lens=body_lens,
        chain=chain,
        piece_conv_from=conv_from,
        tokens=tokens,
        body_starts=[a for a, _ in body_spans],
        shape_key=key,
        all_pos=torch.arange(offset, device=device),
        segment_starts=starts,
        piece_rows=rows[0],
        blend_rows=rows[1],
        blend_pos=blend_pos,
        blend_groups=groups,
        piece_slots=to_device_async(
            torch.tensor([j for j, item in enumerate(chain) if item.kind == "piece"], dtype=torch.long), device
        ),
    )
