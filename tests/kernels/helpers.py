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


def run_in_interpreter(name: str, script: str) -> None:
    """Run ``script`` in a subprocess under Triton's interpreter (``TRITON_INTERPRET=1``: chosen when
    triton is imported, hence the subprocess); it must print nothing but end well. Skips without
    triton, or where Triton 3.6's interpreter meets numpy >= 2.4."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    import pytest

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script) + '\nprint("ok")'],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if r.returncode != 0 and "0-dimensional arrays" in r.stderr:
        pytest.skip("Triton 3.6's interpreter needs numpy < 2.4")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), f"{name}: {r.stderr[-3000:]}"
