"""Backend resolution and CPU-only importability."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hypic_agent.kernels.backend import resolve_backend, resolve_triton


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
        "lazy = ('fla', 'hypic_agent.kernels.chain_triton', 'hypic_agent.kernels.gdn_fla')\n"
        "assert not [m for m in lazy if m in sys.modules]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
