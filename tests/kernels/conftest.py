"""Fixtures for kernel tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def cuda_device() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return "cuda"
