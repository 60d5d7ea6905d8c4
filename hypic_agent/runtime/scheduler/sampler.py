"""Batched sampling on the device: one argmax (and logprob gather) for all greedy rows, the
sampled rows one by one, constraint masks applied first; one read-back of the ids per step. The
rows' settings are read in one pass; per-row work (masks, sampling) runs only for the rows that
have it.

``sample_on_device`` only launches work: the ids, logprobs and top logprobs stay on the device
(``Sampled``) and their copy to the host starts at once, without waiting. ``Sampled.read`` waits
for that copy and returns host values. The scheduler's overlapped decode feeds ``Sampled.ids`` to
the next step's forward before reading them (``scheduler.overlap``); the plain path reads at once
(``sample_rows``). Both run the same device work, so both give the same tokens and logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hypic_agent.runtime.output import OutputStream
from hypic_agent.runtime.sampling import apply_constraint, sample_id

Picked = tuple[int, float, list[tuple[int, float]] | None]


@dataclass
class Sampled:
    """One step's sampled rows, on the device, their copy to the host under way."""

    ids: torch.Tensor  # [N] int64 on the device (what the next step's forward may read)
    top_k: list[int]  # [N] top logprobs wanted per row (0: none)
    want_lp: list[bool]  # [N] whether the row's logprob is read
    _host: list[torch.Tensor]  # ids [N], then logprobs [N] and top (vals [N, K], idx [N, K]) when wanted
    _ready: torch.cuda.Event | None  # recorded after the copies (CUDA), None on the CPU

    def read(self) -> list[Picked]:
        """Wait for the copy; per row ``(token id, logprob under the model, top logprobs or None)``."""
        if self._ready is not None:
            self._ready.synchronize()
        ids = self._host[0].tolist()
        if not any(self.want_lp):
            return [(t, 0.0, None) for t in ids]
        lps = self._host[1].tolist()
        vals, idx = (self._host[2].tolist(), self._host[3].tolist()) if len(self._host) > 2 else ([], [])
        out: list[Picked] = []
        for i, t in enumerate(ids):
            k = self.top_k[i]
            top = list(zip(idx[i][:k], vals[i][:k], strict=True)) if k else None
            out.append((t, lps[i], top))
        return out


def _to_host(parts: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.cuda.Event | None]:
    """Non-blocking copies of ``parts`` into pinned host memory, and the event that marks them done."""
    if parts[0].device.type != "cuda":
        return parts, None
    host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in parts]
    for h, p in zip(host, parts, strict=True):
        h.copy_(p, non_blocking=True)
    ev = torch.cuda.Event()
    ev.record()
    return host, ev


def sample_on_device(
    logits: torch.Tensor, outs: Sequence[OutputStream], gens: Sequence[torch.Generator | None]
) -> Sampled:
    """logits ``[N, vocab]`` fp32 -> the rows' tokens (and logprobs where wanted) on the device, their
    copy to the host started. No host sync unless a row has a constraint (its mask is read on the host)."""
    vocab = logits.shape[-1]
    n = len(outs)
    constrained: list[int] = []  # rows whose mask applies (host work), rows sampled one by one
    sampled: list[int] = []
    want_lp = [False] * n
    top_k = [0] * n
    for i, o in enumerate(outs):  # one pass; the per-row work below runs only for the rows that need it
        s = o.sampling
        if o.constraint is not None:
            constrained.append(i)
        if s.temperature > 0.0:
            sampled.append(i)
        if s.logprobs:
            want_lp[i], top_k[i] = True, min(s.top_logprobs, vocab)
    scores = logits
    if constrained:
        scores = logits.clone()
        for i in constrained:
            scores[i] = apply_constraint(logits[i], outs[i].allowed(vocab))
    ids = scores.argmax(dim=-1)
    for i in sampled:
        ids[i] = sample_id(scores[i], outs[i].sampling, gens[i])
    parts = [ids]
    if any(want_lp):
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # once for every row (chosen and top tokens)
        parts.append(logprobs.gather(1, ids[:, None])[:, 0])
        if max(top_k):
            vals, idx = torch.topk(logprobs, max(top_k), dim=-1)
            parts += [vals, idx]
    host, ready = _to_host(parts)
    return Sampled(ids, top_k, want_lp, host, ready)


def sample_rows(
    logits: torch.Tensor, outs: Sequence[OutputStream], gens: Sequence[torch.Generator | None]
) -> list[Picked]:
    """logits ``[N, vocab]`` fp32 -> per row ``(token id, logprob under the model, top logprobs or None)``."""
    return sample_on_device(logits, outs, gens).read()
