"""Backend resolution and CPU-only importability."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hypic_agent.kernels._varlen import as_int64, normalize_cu_seqlens
from hypic_agent.kernels.backend import resolve_backend, resolve_triton
from hypic_agent.kernels.chain import chain_scan


def test_resolve_on_cpu():
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("torch", "cuda") == "torch"
    assert resolve_triton("auto", "cpu") is False
    with pytest.raises(ValueError):
        resolve_backend("fla", "cpu")
    with pytest.raises(ValueError):
        resolve_backend("cuda-magic", "cpu")


def test_import_does_not_pull_gpu_packages():
    code = (
        "import sys\n"
        "from hypic_agent.kernels import gdn, pairs, chain, conv, rope, attention, moe, backend\n"
        "lazy = ('fla', 'hypic_agent.kernels.chain.chain_triton', 'hypic_agent.kernels.gdn.gdn_fla')\n"
        "assert not [m for m in lazy if m in sys.modules]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cu_seqlens_identity_kept():
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    assert normalize_cu_seqlens(cu, 7, cu.device) is cu
    cu64 = cu.long()
    assert normalize_cu_seqlens(cu64, 7, cu.device) is cu64 and as_int64(cu64) is cu64
    a = as_int64(cu)
    assert a.dtype == torch.int64 and as_int64(cu) is a and torch.equal(a, cu64)
    with pytest.raises(ValueError):
        normalize_cu_seqlens(cu, 8, cu.device)


def test_int64_views_survive_alternating_bounds():
    """A prefix-cache split runs each linear layer over two bounds (``cu_first``, ``cu_rest``): both keep one
    int64 view across the layers, so fla's identity cache of chunk indices hits (no device->host copy a layer)."""
    first = torch.tensor([0, 5], dtype=torch.int32)
    rest = torch.tensor([0, 2], dtype=torch.int32)
    views = [as_int64(first), as_int64(rest)]
    for _layer in range(3):
        assert as_int64(first) is views[0] and as_int64(rest) is views[1]
    assert views[0].tolist() == [0, 5] and views[1].tolist() == [0, 2]


def test_int64_views_survive_a_step_of_many_combines():
    """A step with the pool rows and 12 composed requests asks, at every linear layer, for 13 bounds in turn:
    each keeps its one view across the layers (a view made anew misses fla's cache: a device sync)."""
    bounds = [torch.tensor([0, i + 1, 2 * i + 3], dtype=torch.int32) for i in range(13)]
    views = [as_int64(b) for b in bounds]
    for _layer in range(4):
        assert all(as_int64(b) is v for b, v in zip(bounds, views, strict=True))
    assert views[5].tolist() == [0, 6, 13]


def test_triton_chain_needs_cuda():
    with pytest.raises(ValueError):
        chain_scan(torch.zeros(1, 16, 16), torch.zeros(2, 1, 16, 16), torch.zeros(2, 1, 16, 16), backend="fla")
