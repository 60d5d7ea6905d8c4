"""Projections that read one input, fused into one GEMM (``HybridForCausalLM.fuse_projections``):
the same logits, the same state dict, weights shared with the original parameters."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.models.testing.tiny import TINY_ARCHS
from hypic_agent.runtime.runner.standalone import decode_step, prefill

from .conftest import make_model, rand_tokens


def _logits(model, prompt):
    st = prefill(model, [prompt])[0]
    first = st.last_logits.clone()
    decode_step(model, [st], [5])
    return first, st.last_logits.clone()


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fused_projections_give_the_same_logits(arch):
    model, _, _ = make_model(arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompt = rand_tokens(37, 3)
    ref = _logits(model, prompt)
    model.fuse_projections()
    if arch in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "llama"):
        assert model._fused, "nothing was fused"
    got = _logits(model, prompt)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    state = model.state_dict()
    assert state.keys() == before.keys()
    for name, t in before.items():
        assert torch.equal(state[name], t), name


def test_loading_into_a_fused_model_writes_the_fused_weight():
    model, _, _ = make_model("qwen3_5_moe_text")
    other, sd2, _ = make_model("qwen3_5_moe_text", seed=1)
    prompt = rand_tokens(20, 4)
    want = _logits(other, prompt)
    model.fuse_projections()
    model.load_weights(sd2)
    for a, b in zip(_logits(model, prompt), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_fused_model_moves_dtype_and_stays_fused():
    model, _, _ = make_model("qwen3_5_moe_text")
    prompt = rand_tokens(20, 5)
    model.fuse_projections()
    ref = _logits(model, prompt)
    model.to(torch.float64).to(torch.float32)
    assert model._fused
    moe = next(m for m in model.modules() if getattr(m, "fused_in", None) is not None)
    w = moe.fused_in.weight
    part = next(iter(moe.fused_in.owners))
    assert getattr(*part).untyped_storage().data_ptr() == w.untyped_storage().data_ptr()  # still a view
    for a, b in zip(_logits(model, prompt), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
