"""Body pairs of entry building from the forward's own WY factors, written into the entries.

Entry building runs one varlen pass over ``SeamSplit``'s sub-sequences (every segment cut into
its seam window and its body): the windows from zero, each body from its window's final state
``S_win``. From that pass's factors (fla layout: ``w [1, T, HV, K]``, ``k [1, T, H, K]``, ``gc
[1, T, HV]`` chunk-local cumulative log2 decay over 64-token chunks that restart at every
sub-sequence) and its per-sub-sequence final states ``fin [M, HV, K, V]``, segment j's body pair is

* ``T_body``: the state pass on the identity with zero values, chunk by chunk
  ``h <- exp2(gc_L) h + k^T (exp2(gc_L - gc) * (-w h))``;
* ``S_body = fin_body - T_body S_win`` (its zero-start state: the pass is affine in its start).

A segment without a body gets ``(I, 0)``. The pairs go straight into a ``PairSink`` (the entries'
own tensors), in the sink's dtype; ``S_body`` is computed from the stored ``T_body``, so that the
stored pair reproduces ``fin`` exactly from ``S_win``.

``body_pairs_torch`` is the fp32 reference; ``body_pairs`` runs the Triton kernels on CUDA
(``body_pairs_triton``: final states only, where fla's state pass also writes every chunk's
state) and the reference elsewhere.
"""

from __future__ import annotations

import itertools

import torch

from .backend import resolve_triton
from .pair_sink import PairSink
from .seam_split import CHUNK, SeamSplit


def body_pairs_torch(
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    fin: torch.Tensor,
    S_win_z: torch.Tensor,
    split: SeamSplit,
    sink: PairSink,
) -> None:
    """Reference. k ``[1, T, H, K]``, w ``[1, T, HV, K]``, gc ``[1, T, HV]``, fin ``[M, HV, K, V]``,
    S_win_z ``[Nw+1, HV, K, V]`` (the windows' zero-start states and a zero row) -> ``sink``."""
    H, K = k.shape[2], k.shape[3]
    HV = w.shape[2]
    cu = [0, *itertools.accumulate(split.sub_lens)]  # host bounds: no device read
    eye = torch.eye(K, dtype=torch.float32, device=k.device).expand(HV, K, K)
    for j, (sub, win) in enumerate(zip(split.seg_body_sub_host, split.seg_body_win_host, strict=True)):
        if sub < 0:
            sink.T[j].copy_(eye)
            sink.S[j].zero_()
            continue
        h = eye.clone()
        for lo in range(cu[sub], cu[sub + 1], CHUNK):
            hi = min(lo + CHUNK, cu[sub + 1])
            ww = w[0, lo:hi].float().transpose(0, 1)  # [HV, L, K]
            kk = k[0, lo:hi].float().repeat_interleave(HV // H, dim=1).transpose(0, 1)  # [HV, L, K]
            g = gc[0, lo:hi].float().T  # [HV, L]
            g_last = g[:, -1:]
            v_new = -(ww @ h) * torch.exp2(g_last - g)[..., None]
            h = h * torch.exp2(g_last)[..., None] + kk.transpose(-1, -2) @ v_new
        sink.T[j].copy_(h)
        sink.S[j].copy_(fin[sub].float() - sink.T[j].float() @ S_win_z[win].float())


def body_pairs(
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    fin: torch.Tensor,
    S_win_z: torch.Tensor,
    split: SeamSplit,
    sink: PairSink,
    *,
    backend: str = "auto",
) -> None:
    """Segment body pairs into ``sink`` (see module doc; shapes as ``body_pairs_torch``).
    ``backend``: ``"torch"``, ``"fla"`` / ``"auto"`` (Triton on CUDA)."""
    if len(sink.T) != split.n:
        raise ValueError(f"sink holds {len(sink.T)} pairs for {split.n} segments")
    if resolve_triton(backend, k.device):
        from .body_pairs_triton import body_pairs_triton

        body_pairs_triton(k, w, gc, fin, S_win_z, split, sink)
        return
    body_pairs_torch(k, w, gc, fin, S_win_z, split, sink)
