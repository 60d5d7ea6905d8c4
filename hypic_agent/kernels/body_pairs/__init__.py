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

``body_pairs_torch`` (``body_pairs_torch.py``) is the fp32 reference; ``body_pairs`` runs the
Triton kernels on CUDA (``body_pairs_triton``: final states only, where fla's state pass also
writes every chunk's state) and the reference elsewhere.
"""

from __future__ import annotations

import torch

from ..backend import resolve_triton
from ..pair_sink import PairSink
from ..seam_split import SeamSplit
from .body_pairs_torch import body_pairs_torch

__all__ = ["body_pairs", "body_pairs_torch"]


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
