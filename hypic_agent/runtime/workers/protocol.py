"""The wire protocol between rank 0 and a scatter worker: int64 control tensors, then raw tensors.

Every message goes over the pair's process group with point-to-point ops (``send`` / ``recv``); no
tensor is pickled. A control message is a fixed-size int64 header, optionally followed by one
int64 body whose length the header gives:

* rank 0 -> worker, a job: ``[BUILD, job, n, pair_dtype, n_ids]`` then
  ``[stream_layers, n_prefix] ++ lengths[n] ++ seams[n] ++ prefix ++ ids`` (``prefix``: the build
  context's tokens, ``n_ids`` counting them too); ``[STOP, 0, 0, 0, 0]`` ends the worker's loop.
* worker -> rank 0, at start: ``[READY, 0, 0, 0, n_bytes]`` then the model fingerprint as bytes
  (one int64 per byte), or ``[ERROR, 0, 0, 0, n_bytes]`` then the error text.
* worker -> rank 0, per layer group of the batch (``layer_groups``: ``stream_layers`` layers each,
  0 = all layers in one group), as soon as the batch's layers of that group are built, per entry
  in job order, one control message ``[LAYERS, job, index, group, n_meta] ++ meta``, the metadata
  of the group's tensors (``META_WIDTH`` int64 per tensor: dtype code, ndim, dims padded with
  zeros; rank 0 knows its length from the layers' kinds, ``group_meta_len``), then those tensors
  packed into one flat buffer per dtype (``pack``: pairs in fp32, the rest in the model's dtype),
  each with one ``send``: two or three messages per entry and group rather than two or three per
  layer.
  After the last group: ``[DONE, job, n, build_us, 0]``, ``build_us`` the wall time of the batch's
  build (what the router's cost model is fitted to). Rank 0 assembles an entry from its groups
  and publishes the job's entries only once ``DONE`` has arrived.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hypic_agent.runtime.hypic.entry import AttentionEntry, LinearEntry, SegmentEntry

HEADER = 5
META_WIDTH = 6  # dtype, ndim, up to 4 dims
BUILD, STOP, READY, ERROR, LAYERS, DONE = 1, 2, 3, 4, 5, 6

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64)


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype)


def header(*fields: int) -> torch.Tensor:
    if len(fields) != HEADER:
        raise ValueError(f"a header has {HEADER} fields, got {len(fields)}")
    return torch.tensor(fields, dtype=torch.int64)


@dataclass(frozen=True)
class Job:
    """A build job: segments' token ids and seam widths, the pairs' dtype, how many layers go back
    per message (``stream_layers``, 0 = all of them once the batch is built) and the build context's
    tokens every segment is prefilled after (``prefix``, ``BuildContext.tokens``; empty: isolated)."""

    job: int
    segments: list[tuple[int, ...]]
    seams: list[int]
    pair_dtype: torch.dtype
    stream_layers: int = 0
    prefix: tuple[int, ...] = ()

    def encode(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids = list(self.prefix) + [t for s in self.segments for t in s]
        hdr = header(BUILD, self.job, len(self.segments), dtype_code(self.pair_dtype), len(ids))
        vals = [self.stream_layers, len(self.prefix)] + [len(s) for s in self.segments] + list(self.seams) + ids
        return hdr, torch.tensor(vals, dtype=torch.int64)

    @staticmethod
    def body_len(hdr: torch.Tensor) -> int:
        return 2 + 2 * int(hdr[2]) + int(hdr[4])

    @staticmethod
    def decode(hdr: torch.Tensor, body: torch.Tensor) -> Job:
        n = int(hdr[2])
        stream, n_prefix, *vals = body.tolist()
        lengths, seams, ids = vals[:n], vals[n : 2 * n], vals[2 * n :]
        prefix, ids = tuple(ids[:n_prefix]), ids[n_prefix:]
        segs: list[tuple[int, ...]] = []
        at = 0
        for n_tok in lengths:
            segs.append(tuple(ids[at : at + n_tok]))
            at += n_tok
        return Job(int(hdr[1]), segs, seams, DTYPES[int(hdr[3])], stream, prefix)


def text_body(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.int64)


def body_text(body: torch.Tensor) -> str:
    return bytes(int(x) for x in body.tolist()).decode(errors="replace")


def layer_groups(n_layers: int, stream_layers: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` layer ranges an entry travels in: ``stream_layers`` layers each (the
    last group shorter); ``stream_layers <= 0`` (or >= the layer count): one group of all layers."""
    step = stream_layers if 0 < stream_layers < n_layers else n_layers
    return [(a, min(a + step, n_layers)) for a in range(0, n_layers, step)]


def layer_tensors(e: SegmentEntry, start: int, end: int) -> list[torch.Tensor]:
    """Layers ``start..end-1`` of an entry, in wire order: per layer (T, S, conv tail) or (k, v)."""
    out: list[torch.Tensor] = []
    for layer in e.layers[start:end]:
        out += [layer.T, layer.S, layer.conv_tail] if isinstance(layer, LinearEntry) else [layer.k, layer.v]
    return out


def entry_tensors(e: SegmentEntry) -> list[torch.Tensor]:
    """An entry's tensors in wire order (its layer groups' tensors, one group after the other)."""
    return layer_tensors(e, 0, len(e.layers))


def group_meta_len(layer_kinds: Sequence[str], start: int, end: int) -> int:
    """The int64 metadata of layers ``start..end-1`` of an entry: 3 tensors per linear layer, 2 per attention."""
    return META_WIDTH * sum(3 if kind == "linear" else 2 for kind in layer_kinds[start:end])


def encode_meta(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    rows = []
    for t in tensors:
        if t.dim() > META_WIDTH - 2:
            raise ValueError(f"tensors of up to {META_WIDTH - 2} dims go over the wire, got {t.dim()}")
        dims = list(t.shape) + [0] * (META_WIDTH - 2 - t.dim())
        rows.append([dtype_code(t.dtype), t.dim(), *dims])
    return torch.tensor(rows, dtype=torch.int64).reshape(-1)


def decode_meta(meta: torch.Tensor) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    out = []
    for row in meta.reshape(-1, META_WIDTH).tolist():
        out.append((DTYPES[row[0]], tuple(row[2 : 2 + row[1]])))
    return out


def assemble(
    tensors: Sequence[torch.Tensor], layer_kinds: Sequence[str], token_ids: tuple[int, ...], seam: int, ms: float
) -> SegmentEntry:
    """The entry whose wire tensors are ``tensors`` (``entry_tensors`` order)."""
    it = iter(tensors)
    layers: list[LinearEntry | AttentionEntry] = []
    for kind in layer_kinds:
        if kind == "linear":
            layers.append(LinearEntry(next(it), next(it), next(it)))
        else:
            layers.append(AttentionEntry(next(it), next(it)))
    if next(it, None) is not None:
        raise ValueError("more tensors than the model's layers take")
    return SegmentEntry(token_ids, seam, layers, ms)


def flat_layout(meta: Sequence[tuple[torch.dtype, tuple[int, ...]]]) -> list[tuple[torch.dtype, int]]:
    """The flat buffers an entry travels in: per dtype (first-appearance order) its total numel."""
    sizes: dict[torch.dtype, int] = {}
    for dt, shape in meta:
        sizes[dt] = sizes.get(dt, 0) + math.prod(shape)
    return list(sizes.items())


def pack(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` as one flat buffer per dtype (``flat_layout`` order)."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t.reshape(-1))
    return [torch.cat(g) for g in groups.values()]


def unpack(
    flats: Sequence[torch.Tensor], meta: Sequence[tuple[torch.dtype, tuple[int, ...]]], separate: bool
) -> list[torch.Tensor]:
    """The tensors of ``meta`` out of ``pack``'s buffers: views of them, or (``separate``) each a copy
    of its own (a CPU tier keeps tensors as they are, and safetensors refuses shared memory)."""
    by_dtype = {f.dtype: f for f in flats}
    at = dict.fromkeys(by_dtype, 0)
    out = []
    for dt, shape in meta:
        n = math.prod(shape)
        t = by_dtype[dt][at[dt] : at[dt] + n].view(shape)
        at[dt] += n
        out.append(t.clone() if separate else t)
    return out
