"""Shared fixtures: tiny seeded models of every architecture, ours and transformers' (the oracle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from hypic_agent.runtime.models.hybrid import HybridForCausalLM, build_model
from hypic_agent.runtime.models.testing.tiny import TINY_ARCHS, build_hf_model, random_state_dict, tiny_config


def make_model(
    arch: str = "qwen3_5_text", seed: int = 0, slow_decay: bool = False, **overrides: Any
) -> tuple[HybridForCausalLM, dict[str, torch.Tensor], dict[str, Any]]:
    cfg = tiny_config(arch)
    cfg.update(overrides)
    sd = random_state_dict(cfg, seed=seed)
    if slow_decay:  # long memory, so dropping T_C (naive addition) shows
        for k in sd:
            if k.endswith("A_log"):
                sd[k] = torch.full_like(sd[k], -4.0)
            elif k.endswith("dt_bias"):
                sd[k] = torch.full_like(sd[k], -3.0)
    model = build_model(cfg)
    model.load_weights(sd)
    return model, sd, cfg


@pytest.fixture(params=TINY_ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def model_and_oracle(arch: str) -> tuple[HybridForCausalLM, Any]:
    model, sd, cfg = make_model(arch)
    return model, build_hf_model(cfg, sd)


def rand_tokens(n: int, seed: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@dataclass
class Seg:
    """A tokenized segment as the engine's plans carry it (``engine.PlanLike``)."""

    token_ids: tuple[int, ...]
    kind: str = "document"


@dataclass
class Plan:
    """A prompt plan of token-level segments and a suffix (``engine.PlanLike``)."""

    segments: list[Seg]
    suffix_ids: list[int] = field(default_factory=lambda: rand_tokens(5, 77))
    bos_id: int | None = None


def finish_gguf(w: Any, tensors: Any, q8: bool = False, keep_float: tuple[str, ...] = ("conv", "norm")) -> None:
    """Add ``(name, array)`` ``tensors`` to the ``GGUFWriter`` ``w`` and write the file; with ``q8``, as
    llama.cpp's converter quantizes: Q8_0 for matrices whose rows are whole 32-blocks, F32 for the rest
    and for names containing any of ``keep_float``."""
    import gguf

    for name, v in tensors:
        if q8 and v.ndim >= 2 and v.shape[-1] % 32 == 0 and not any(k in name for k in keep_float):
            q = gguf.quantize(v, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_stub_gguf(path: Path, arch: str) -> Path:
    """A GGUF of architecture ``arch`` holding one 4x4 tensor (for the loader's refusals)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    finish_gguf(w, [("token_embd.weight", np.zeros((4, 4), dtype=np.float32))])
    return path
