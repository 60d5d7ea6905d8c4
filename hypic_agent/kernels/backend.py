"""Backend selection for the numerical ops.

Every op takes ``backend="auto" | "torch" | "fla"``. ``"fla"`` means the GPU kernels (fla-core
ops and the project's own Triton kernels); it is only ever chosen on a CUDA device. Imports of
``fla`` and ``triton`` are lazy so that the package imports on CPU-only machines.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Literal

import numpy as np
import torch

Backend = Literal["torch", "fla"]
_NAMES = ("auto", "torch", "fla")


@functools.cache
def fla_available() -> bool:
    """True when ``fla`` (fla-core) and ``triton`` import and CUDA is present."""
    if not torch.cuda.is_available():
        return False
    try:
        importlib.import_module("fla")
        importlib.import_module("triton")
    except Exception:
        return False
    return True


@functools.cache
def triton_available() -> bool:
    """True when ``triton`` imports and CUDA is present (our own Triton kernels)."""
    if not torch.cuda.is_available():
        return False
    try:
        importlib.import_module("triton")
    except Exception:
        return False
    return True


def _device_type(device: torch.device | str | None) -> str:
    if device is None:
        return "cpu"
    return torch.device(device).type


def same_device(here: torch.device, device: torch.device) -> bool:
    """Whether ``here`` is ``device`` (``cuda`` without an index matches any CUDA device)."""
    return here.type == device.type and (device.index is None or here.index == device.index)


def on_device(t: torch.Tensor, device: torch.device) -> bool:
    """Whether ``t`` lives on ``device`` (``cuda`` without an index matches any CUDA device)."""
    return same_device(t.device, device)


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor -> ``device``; on CUDA through pinned memory and non-blocking, so the copy does not
    wait for the stream (a pageable copy would)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def upload_int64(arrays: list[Any], device: torch.device) -> list[torch.Tensor]:
    """int64 host arrays -> device tensors: one pinned buffer, one non-blocking copy, then views, each
    starting 16-byte aligned (Triton specializes kernels on the alignment of pointer arguments)."""
    flat = [np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]
    starts = np.cumsum([0] + [a.size + a.size % 2 for a in flat])
    packed = np.zeros(int(starts[-1]), dtype=np.int64)
    for a, start in zip(flat, starts, strict=False):
        packed[start : start + a.size] = a
    on_dev = to_device_async(torch.from_numpy(packed), device)
    return [on_dev[int(start) : int(start) + a.size] for a, start in zip(flat, starts, strict=False)]


def refill_async(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Overwrite the device tensor ``dst`` with the host tensor ``src`` (same shape), without waiting
    for the stream on CUDA (pinned, non-blocking): how launch tables that a CUDA graph reads are
    rewritten between replays."""
    if dst.is_cuda:
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def resolve_backend(name: str, device: torch.device | str | None) -> Backend:
    """Map a requested backend name to the one that will run.

    ``"auto"`` -> ``"fla"`` when ``device`` is CUDA and fla imports, else ``"torch"``.
    ``"fla"`` on a non-CUDA device or without fla installed raises ``ValueError`` (say
    ``backend="torch"`` or install the ``[gpu]`` extra).
    """
    if name not in _NAMES:
        raise ValueError(f"unknown kernel backend {name!r}; use one of {_NAMES}")
    if name == "torch":
        return "torch"
    on_cuda = _device_type(device) == "cuda"
    if name == "auto":
        return "fla" if on_cuda and fla_available() else "torch"
    if not on_cuda:
        raise ValueError(f"backend='fla' needs CUDA tensors, got device {device}; use backend='torch'")
    if not fla_available():
        raise ValueError("backend='fla' needs fla-core and triton (pip install 'hypic-agent[gpu]')")
    return "fla"


def resolve_triton(name: str, device: torch.device | str | None) -> bool:
    """Whether a project Triton kernel (chain scan) should run: like ``resolve_backend`` but
    only needs ``triton`` (not fla)."""
    if name not in _NAMES:
        raise ValueError(f"unknown kernel backend {name!r}; use one of {_NAMES}")
    if name == "torch":
        return False
    on_cuda = _device_type(device) == "cuda"
    if name == "auto":
        return on_cuda and triton_available()
    if not on_cuda or not triton_available():
        raise ValueError(f"backend={name!r} needs CUDA tensors and triton; use backend='torch'")
    return True


def autotune_cache() -> dict[str, bool]:
    """``triton.autotune`` keyword that keeps tuning results in Triton's on-disk cache, where the
    installed Triton has it (so a warm cache skips re-tuning in a new process)."""
    import inspect

    import triton

    return {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def interpreting() -> bool:
    """True under Triton's CPU interpreter (``TRITON_INTERPRET=1``, the CI kernel tests). Triton 3.6's
    interpreter miscomputes ``tl.dot`` on bf16 values converted inside a kernel, so kernels that split
    an fp32 state into bf16 halves take their fp32 (tf32x3) path there; the GPU tests cover the split."""
    import triton.knobs

    return bool(triton.knobs.runtime.interpret)
