"""Training GDN kernel: outputs and all five input gradients vs the per-token recurrence."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.models.testing.tiny import tiny_config
from hypic_agent.training.gdn_train import (
    check_gradients,
    chunk_gdn_torch,
    gdn_function,
    resolve_gdn_backend,
)


@pytest.mark.parametrize(("L", "H", "HV"), [(100, 2, 2), (64, 1, 3), (5, 2, 4)])
def test_torch_chunked_matches_recurrence_fp64(L: int, H: int, HV: int) -> None:
    errs = check_gradients(chunk_gdn_torch, L=L, H=H, HV=HV, K=8, V=12)
    assert max(errs.values()) < 1e-10, errs


def test_torch_chunked_fp32_and_small_chunks() -> None:
    errs = check_gradients(lambda *a: chunk_gdn_torch(*a, chunk=16), L=70, dtype=torch.float32)
    assert max(errs.values()) < 1e-4, errs


def test_backend_resolution_on_cpu() -> None:
    assert resolve_gdn_backend("auto", "cpu") == "torch"
    assert resolve_gdn_backend("torch", "cpu") == "torch"
    with pytest.raises(InvalidRequestError, match="not usable"):
        resolve_gdn_backend("fla", "cpu")
    with pytest.raises(InvalidRequestError, match="unknown"):
        resolve_gdn_backend("cuda-magic", "cpu")
    assert gdn_function("torch") is chunk_gdn_torch


def test_training_forward_matches_runtime_prefill() -> None:
    """forward.run_model (SDPA, conv1d, training GDN) == runtime prefill, every tiny arch."""
    from hypic_agent.runtime.models.hybrid import build_model
    from hypic_agent.runtime.models.testing.tiny import random_state_dict
    from hypic_agent.runtime.runner.standalone import prefill
    from hypic_agent.training.forward import run_model

    for arch in ("qwen3_5_text", "llama", "qwen3_next"):
        raw = tiny_config(arch)
        model = build_model(raw)
        model.load_weights(random_state_dict(raw, 3))
        ids = torch.randint(0, raw["vocab_size"], (2, 70), generator=torch.Generator().manual_seed(1))
        ref = torch.stack([prefill(model, [r.tolist()], all_logits=True)[0].all_logits for r in ids])
        out = model.logits(run_model(model, ids, grad_checkpoint=True).final)
        assert (out - ref).abs().max().item() < 1e-4, arch
