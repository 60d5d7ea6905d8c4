"""GPU: fla fused RMSNorm / gated RMSNorm against the torch references (Qwen3.5-35B-A3B shapes), and
SDPA's native GQA against repeat_interleave (the other half of the prefill elementwise cleanup)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypic_agent.kernels import norm
from hypic_agent.kernels.attention.attention_torch import sdpa as _sdpa
from hypic_agent.runtime.models.layers.norms import GatedRMSNorm, RMSNorm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
pytest.importorskip("fla")

TOL = {torch.bfloat16: 2e-2, torch.float32: 1e-5}


def _scaled_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref| in fp32."""
    a, ref = a.float(), ref.float()
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _rand(*shape: int, seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda") * scale + shift


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("shape", [(8192, 2048), (1024, 16, 256)])
def test_rms_norm_fla_matches_torch(dtype, zero_centered, shape):
    x = _rand(*shape, seed=0, scale=3.0).to(dtype)
    w = _rand(shape[-1], seed=1, scale=0.2, shift=0.0 if zero_centered else 1.0).to(dtype)
    with torch.no_grad():
        from hypic_agent.kernels.norm.norm_fla import rms_norm_fla  # raises on fla drift (no silent fallback)

        rms_norm_fla(x[:4], w.float(), 1e-6)
        out = norm.rms_norm(x, w, 1e-6, zero_centered=zero_centered, backend="fla")
        ref = norm.rms_norm(x, w, 1e-6, zero_centered=zero_centered, backend="torch")
    assert "rms_norm" not in norm.FLA_ERRORS, norm.FLA_ERRORS
    err = _scaled_err(out, ref)
    print(f"rms_norm {dtype} zero_centered={zero_centered} {shape}: scaled max err {err:.2e}")
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    assert err < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gated_rms_norm_fla_matches_torch(dtype):
    x = _rand(8192, 32, 128, seed=2, scale=0.5).to(dtype)
    z = _rand(8192, 32, 128, seed=3, scale=2.0).to(dtype)
    w = _rand(128, seed=4, scale=0.2, shift=1.0).to(dtype)
    with torch.no_grad():
        from hypic_agent.kernels.norm.norm_fla import gated_rms_norm_fla

        gated_rms_norm_fla(x[:4], z[:4], w, 1e-6)
        out = norm.gated_rms_norm(x, z, w, 1e-6, backend="fla")
        ref = norm.gated_rms_norm(x, z, w, 1e-6, backend="torch")
    assert "gated_rms_norm" not in norm.FLA_ERRORS, norm.FLA_ERRORS
    err = _scaled_err(out, ref)
    print(f"gated_rms_norm {dtype}: scaled max err {err:.2e}")
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    assert err < TOL[dtype]


def test_modules_auto_use_fla_in_inference_and_torch_with_grad():
    mod = RMSNorm(256, 1e-6, True).cuda().to(torch.bfloat16)
    gmod = GatedRMSNorm(128, 1e-6).cuda().to(torch.bfloat16)
    qk = _rand(512, 24, 256, seed=5).to(torch.bfloat16)[:, :16]  # non-contiguous head slice
    o, z = _rand(512, 32, 128, seed=6).to(torch.bfloat16), _rand(512, 32, 128, seed=7).to(torch.bfloat16)
    with torch.inference_mode():
        a, b = mod(qk), gmod(o, z)
    assert not norm.FLA_ERRORS, norm.FLA_ERRORS
    assert _scaled_err(a, norm.rms_norm_torch(qk, mod.weight, 1e-6, True)) < 2e-2
    assert _scaled_err(b, norm.gated_rms_norm_torch(o, z, gmod.weight, 1e-6)) < 2e-2
    # training: grad through the torch path, identical to the reference
    x = qk.detach().clone().requires_grad_()
    y = mod(x)
    y.float().sum().backward()
    assert torch.equal(y, norm.rms_norm_torch(x, mod.weight, 1e-6, True))
    assert x.grad is not None and mod.weight.grad is not None


@pytest.mark.parametrize("causal_mask", [False, True])
def test_sdpa_native_gqa_matches_repeat(causal_mask):
    Hq, Hkv, L, D = 16, 2, 1024, 256  # Qwen3.5-35B-A3B full-attention heads
    q = _rand(Hq, L, D, seed=8).to(torch.bfloat16)
    k, v = _rand(Hkv, L, D, seed=9).to(torch.bfloat16), _rand(Hkv, L, D, seed=10).to(torch.bfloat16)
    mask = torch.ones(L, L, dtype=torch.bool, device="cuda").tril() if causal_mask else None
    with torch.no_grad():
        out = _sdpa(q, k, v, mask, mask is None, D**-0.5)
        kr, vr = k.repeat_interleave(Hq // Hkv, 0), v.repeat_interleave(Hq // Hkv, 0)
        ref = F.scaled_dot_product_attention(q.float(), kr.float(), vr.float(), is_causal=True, scale=D**-0.5)
    err = _scaled_err(out, ref)
    print(f"sdpa gqa mask={causal_mask}: scaled max err {err:.2e}")
    assert out.shape == (Hq, L, D) and out.dtype == torch.bfloat16 and err < 2e-2
