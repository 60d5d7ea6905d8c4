"""Splice tables: where a combine forward reads the cached state besides the transition pairs.

Each linear layer's pieces start their conv from the tail of the body before them; each attention
layer's bodies bring their keys and values. Instead of stacking per-entry tensors layer by layer,
the request's pointers go into three ``kernels.gather_spans`` tables, built on the host from the
entries' cached pointers (``SegmentEntry.splice_pointers``) and copied once:

* ``conv`` ``[L_lin * P, 3]``: every linear layer's conv tails into one ``[L_lin, P, C, W-1]``
  tensor (one launch before the forward; zeros for a piece with no body before it);
* ``keys`` ``[L_attn, nb, 3]``: per attention layer, the bodies' un-rotated keys packed ``[Tb, Hkv, D]``
  (then rotated to their positions);
* ``values`` ``[L_attn, nb, 3]``: per attention layer, the bodies' values straight into their rows of
  the spliced ``[L, Hkv, D]``.

(MLA layers: rope keys ``[.., 1, rope]`` and latents ``[.., 1, r]``; a key row and a value row differ.)

The tables depend on the entries only through their pointers: a CUDA graph of the forward
(``combine_graphs``) replays with ``refresh`` rewriting them in place. ``build`` returns None where
pointers cannot be used (CPU without Triton, non-contiguous or mixed-dtype entries): the forward
then stacks the tensors (the twin path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hypic_agent.kernels.backend import refill_async, resolve_triton, to_device_async
from hypic_agent.kernels.gather_spans import gather_spans
from hypic_agent.runtime.hypic.entry import SegmentEntry
from hypic_agent.runtime.hypic.layout import CombineLayout
from hypic_agent.runtime.models.hybrid import HybridForCausalLM


@dataclass
class SpliceTables:
    conv: torch.Tensor  # [L_lin * P, 3] int64 on the device
    keys: torch.Tensor  # [L_attn, nb, 3]
    values: torch.Tensor  # [L_attn, nb, 3]
    dtype: torch.dtype  # of the conv tails, keys and values
    conv_shape: tuple[int, int, int, int]  # (L_lin, P, C, W-1)
    k_row: tuple[int, int]  # (Hkv, D): one key row (MLA: (1, rope))
    v_row: tuple[int, int]  # one value row (MLA: (1, r))
    body_rows: int  # Tb
    kv_max: int  # elements of the longest body (launch grid)
    attn_rows: dict[int, int]  # attention layer index -> its row of ``keys`` / ``values``

    def conv_tails(self) -> torch.Tensor:
        """Conv state entering every piece of every linear layer ``[L_lin, P, C, W-1]``."""
        L, P, C, W1 = self.conv_shape
        dst = torch.empty(L, P, C, W1, dtype=self.dtype, device=self.conv.device)
        return gather_spans(self.conv, dst, C * W1)

    def bodies(self, li: int, v_full: torch.Tensor) -> torch.Tensor:
        """Attention layer ``li``: its bodies' values into their rows of ``v_full [L, Hkv, D]``; returns
        their un-rotated keys ``[Tb, Hkv, D]``."""
        row = self.attn_rows[li]
        gather_spans(self.values[row], v_full, self.kv_max)
        kb = torch.empty(self.body_rows, *self.k_row, dtype=self.dtype, device=v_full.device)
        return gather_spans(self.keys[row], kb, self.kv_max)

    def refresh(self, model: HybridForCausalLM, lay: CombineLayout, entries: list[SegmentEntry | None]) -> None:
        """Rewrite the tables in place for another request of the same layout (``lay.shape_key``)."""
        conv, keys, values, dtype = _host_tables(model, lay, entries)
        if dtype != self.dtype:
            raise ValueError(f"entries are {dtype}, the splice tables were planned for {self.dtype}")
        for dev, host in ((self.conv, conv), (self.keys, keys), (self.values, values)):
            refill_async(dev, host)


def _shapes(
    model: HybridForCausalLM,
) -> tuple[list[int], list[int], tuple[int, int], tuple[tuple[int, int], tuple[int, int]]]:
    lin = [i for i, layer in enumerate(model.layers) if layer.linear_attn is not None]
    att = [i for i, layer in enumerate(model.layers) if layer.self_attn is not None]
    conv = (0, 0)
    if lin:
        mixer = model.layers[lin[0]].linear_attn
        assert mixer is not None
        conv = (mixer.conv_dim, mixer.kernel - 1)
    kv = ((0, 0), (0, 0))
    if att:
        attn = model.layers[att[0]].self_attn
        assert attn is not None
        kv = (attn.k_row, attn.v_row)
    return lin, att, conv, kv


def _host_tables(
    model: HybridForCausalLM, lay: CombineLayout, entries: list[SegmentEntry | None]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype]:
    """The three tables on the host (``[L_lin * P, 3]``, ``[L_attn, nb, 3]`` twice) and the dtype.
    Raises ``ValueError`` where pointers cannot be used."""
    lin, att, (C, W1), (k_row, v_row) = _shapes(model)
    dtypes: set[torch.dtype] = set()
    ptrs: dict[int, torch.Tensor] = {}
    kvp: dict[int, torch.Tensor] = {}
    for s in {*(x for x in lay.piece_conv_from if x is not None), *lay.body_segments}:
        e = entries[s]
        assert e is not None
        sp = e.splice_pointers()
        dtypes.add(sp.dtype)
        ptrs[s], kvp[s] = sp.conv, sp.kv
    if len(dtypes) > 1:
        raise ValueError("splicing by pointer needs entries of one dtype")
    dtype = dtypes.pop() if dtypes else model.model.embed_tokens.weight.dtype
    P = len(lay.piece_conv_from)
    zero = torch.zeros(len(lin), dtype=torch.int64)
    blocks = [zero if s is None else ptrs[s] for s in lay.piece_conv_from]
    src = torch.stack(blocks, dim=1) if P else torch.zeros(len(lin), 0, dtype=torch.int64)
    conv_numel = C * W1
    dst = torch.arange(len(lin) * P, dtype=torch.int64).view(len(lin), P) * conv_numel
    conv = torch.stack([src, dst, torch.full_like(src, conv_numel)], dim=-1).reshape(-1, 3)
    nb = len(lay.body_segments)
    k_el, v_el = k_row[0] * k_row[1], v_row[0] * v_row[1]  # elements of one key / value row
    el = torch.empty(0, dtype=dtype).element_size()
    if nb:
        kv = torch.stack([kvp[s] for s in lay.body_segments], dim=1)  # [L_attn, nb, 2]
        head = torch.tensor(
            [entries[s].n_tokens - n for s, n in zip(lay.body_segments, lay.body_lens, strict=True)],  # type: ignore[union-attr]
            dtype=torch.int64,
        )  # seam rows before each body
        lens = torch.tensor(lay.body_lens, dtype=torch.int64)
        k_dst = (torch.cumsum(lens, 0) - lens) * k_el
        v_dst = torch.tensor(lay.body_starts, dtype=torch.int64) * v_el
        n_att = len(att)
        keys = torch.stack(
            [kv[..., 0] + head * k_el * el, k_dst.expand(n_att, nb), (lens * k_el).expand(n_att, nb)], dim=-1
        )
        values = torch.stack(
            [kv[..., 1] + head * v_el * el, v_dst.expand(n_att, nb), (lens * v_el).expand(n_att, nb)], dim=-1
        )
    else:
        keys = values = torch.zeros(len(att), 0, 3, dtype=torch.int64)
    return conv, keys.contiguous(), values.contiguous(), dtype


def build(
    model: HybridForCausalLM, lay: CombineLayout, entries: list[SegmentEntry | None], device: torch.device
) -> SpliceTables | None:
    """The request's splice tables on ``device``, or None (stack the tensors instead; see module doc)."""
    mixer = next((m for layer in model.layers for m in (layer.linear_attn, layer.self_attn) if m is not None), None)
    if mixer is None or not resolve_triton(mixer.backend, device):
        return None
    try:
        conv, keys, values, dtype = _host_tables(model, lay, entries)
    except ValueError:
        return None
    if dtype != model.model.embed_tokens.weight.dtype:  # the activations the tails and bodies join
        return None
    lin, att, conv_shape, (k_row, v_row) = _shapes(model)
    return SpliceTables(
        to_device_async(conv, device),
        to_device_async(keys, device),
        to_device_async(values, device),
        dtype,
        (len(lin), len(lay.piece_conv_from), *conv_shape),
        k_row,
        v_row,
        sum(lay.body_lens),
        max(lay.body_lens, default=0) * max(k_row[0] * k_row[1], v_row[0] * v_row[1]),
        {li: r for r, li in enumerate(att)},
    )
