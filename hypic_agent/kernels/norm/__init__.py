"""RMSNorm and the GDN gated RMSNorm: torch references and the fused fla kernels (CUDA inference).

Layouts: x, z ``[..., D]`` (any leading dims; the norm runs over the last dim), weight ``[D]``.

* ``rms_norm(zero_centered=True)`` (Qwen3.5 / Qwen3-Next): ``norm(x) * (1 + w)`` in fp32, cast once.
* ``rms_norm(zero_centered=False)`` (Llama): ``w * norm(x).to(dtype)``.
* ``gated_rms_norm``: ``(w * norm(x).to(dtype)) * silu(z.float())`` cast to x's dtype (norm before gate).

The torch twins (``norm_torch``) are bit-for-bit the models' former norm code (CPU numerics stay
identical). The fla path (one Triton kernel per call) computes the whole chain in fp32 and rounds
once, so it differs from the torch path by bf16 rounding only. It runs only where autograd is not
needed (``torch.no_grad`` / ``inference_mode``, or nothing requires grad); training keeps torch.
If the fla call fails (import or signature drift) one warning is logged and that op uses torch for
the rest of the process; the error is kept in ``FLA_ERRORS``. Inputs of fewer than ``min_rows``
rows stay on torch (host-bound short forwards; ``KernelConfig.norm_fla_min_rows``).

For rows of at most 512 features (attention's per-head q/k norms, GDN's gated norm) fla runs
row-block kernels whose autotune key holds ``NB``, the number of row blocks (``ceil(rows / 2048)``
for ``rms_norm``, ``ceil(rows / 65536)`` for the gated norm): every new block count is a new
autotune of nine launch shapes. Measured on the H200 (Qwen3.5-35B-A3B shape, the served steps of
``benchmarks/qps.py``, whose row counts change from step to step): 8 such autotunes of 7.8-9.7 s
each held requests for seconds. Longer inputs therefore go to fla in pieces of one block
(``in_blocks``): each kernel is tuned once, for one block, and every later call reuses that.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

import torch

from ..backend import resolve_backend
from ..config import DEFAULT_KERNELS
from .norm_torch import gated_rms_norm_torch, rms_norm_torch

__all__ = ["FLA_ERRORS", "gated_rms_norm", "gated_rms_norm_torch", "in_blocks", "rms_norm", "rms_norm_torch"]

log = logging.getLogger(__name__)

FLA_ERRORS: dict[str, str] = {}
"""op name -> error of the fla call that failed (that op then stays on torch)."""

ROW_BLOCKS = {"rms_norm": 2048, "gated_rms_norm": 2048 * 32}  # rows per block of fla's row-block kernels
ROW_KERNEL_MAX_D = 512  # features up to which fla runs those kernels


def in_blocks(fn: Callable[..., torch.Tensor], block: int, *xs: torch.Tensor) -> torch.Tensor:
    """``fn(*xs)`` over xs ``[..., D]`` (one shape) -> ``[..., D]``, in pieces of at most ``block``
    rows when D is small enough for fla's row-block kernels (module doc)."""
    x = xs[0]
    d = x.shape[-1]
    rows = x.numel() // max(d, 1)
    if d > ROW_KERNEL_MAX_D or rows <= block:
        return fn(*xs)
    flat = [t.reshape(rows, d) for t in xs]
    return torch.cat([fn(*(t[a : a + block] for t in flat)) for a in range(0, rows, block)]).view(x.shape)


# id(weight) -> (weakref to weight, data_ptr, version, fp32 ``1 + w``)
_PLUS_ONE: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}


def _use_fla(op: str, backend: str, min_rows: int, *ts: torch.Tensor) -> bool:
    x = ts[0]
    if op in FLA_ERRORS or x.numel() == 0 or resolve_backend(backend, x.device) != "fla":
        return False
    if x.numel() < min_rows * x.shape[-1]:
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in ts))


def _fla_failed(op: str, err: Exception) -> None:
    FLA_ERRORS[op] = f"{type(err).__name__}: {err}"
    log.warning("fla %s failed (%s); using the torch implementation from now on", op, FLA_ERRORS[op])


def _plus_one(weight: torch.Tensor) -> torch.Tensor:
    """fp32 ``1 + weight``, cached per weight tensor while its storage and version are unchanged."""
    try:
        key = (weight.data_ptr(), weight._version)
    except RuntimeError:  # inference tensors carry no version counter: no caching
        return 1.0 + weight.float()
    hit = _PLUS_ONE.get(id(weight))
    if hit is not None and hit[0]() is weight and hit[1:3] == key:
        return hit[3]
    w1 = 1.0 + weight.float()
    wid = id(weight)
    _PLUS_ONE[wid] = (weakref.ref(weight, lambda _r: _PLUS_ONE.pop(wid, None)), *key, w1)
    return w1


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    zero_centered: bool,
    backend: str = "auto",
    min_rows: int = DEFAULT_KERNELS.norm_fla_min_rows,
) -> torch.Tensor:
    """RMSNorm over the last dim: x ``[..., D]``, weight ``[D]`` -> ``[..., D]``.

    Output dtype: x's (zero-centered), else ``promote(weight, x)`` as in the reference. ``min_rows``:
    fewer rows stay on torch (``KernelConfig.norm_fla_min_rows``).
    """
    if _use_fla("rms_norm", backend, min_rows, x, weight):
        try:
            from .norm_fla import rms_norm_fla

            block = ROW_BLOCKS["rms_norm"]
            if zero_centered:
                w1 = _plus_one(weight)
                return in_blocks(lambda t: rms_norm_fla(t, w1, eps), block, x)
            out = in_blocks(lambda t: rms_norm_fla(t, weight, eps), block, x)
            return out.to(torch.promote_types(weight.dtype, x.dtype))
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:  # never crash the forward on an fla problem
            _fla_failed("rms_norm", err)
    return rms_norm_torch(x, weight, eps, zero_centered)


def gated_rms_norm(
    x: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backend: str = "auto",
    *,
    min_rows: int = DEFAULT_KERNELS.norm_fla_min_rows,
) -> torch.Tensor:
    """Gated RMSNorm ``w * norm(x) * silu(z)``: x, z ``[..., D]``, weight ``[D]`` -> ``[..., D]`` (x's dtype).

    The fla path needs x and z of one shape (z broadcasting stays on torch). ``min_rows`` as in
    ``rms_norm``.
    """
    if x.shape == z.shape and _use_fla("gated_rms_norm", backend, min_rows, x, z, weight):
        try:
            from .norm_fla import gated_rms_norm_fla

            return in_blocks(lambda a, b: gated_rms_norm_fla(a, b, weight, eps), ROW_BLOCKS["gated_rms_norm"], x, z)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:
            _fla_failed("gated_rms_norm", err)
    return gated_rms_norm_torch(x, z, weight, eps)
