"""Helpers for kernel tests: small random GDN inputs with realistic gates, relative error."""

from __future__ import annotations

import torch


def gdn_inputs(
    T: int,
    H: int = 2,
    HV: int = 4,
    K: int = 16,
    V: int = 8,
    *,
    seed: int = 0,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """q, k ``[T,H,K]``, v ``[T,HV,V]``, g ``[T,HV]`` (<= 0), beta ``[T,HV]`` in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    out = {
        "q": r(T, H, K),
        "k": r(T, H, K),
        "v": r(T, HV, V),
        "g": -torch.nn.functional.softplus(r(T, HV)) * 0.3,
        "beta": torch.sigmoid(r(T, HV)),
    }
    return {n: x.to(device=device, dtype=dtype if n in ("q", "k", "v") else torch.float32) for n, x in out.items()}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in fp64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
