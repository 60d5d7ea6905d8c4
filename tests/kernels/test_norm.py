"""RMSNorm / gated RMSNorm ops: the torch path is bit-identical to the pre-fla module code; the
fla dispatch (grad guard, ``1 + w`` cache, fallback on failure) checked on CPU with a fake module."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from hypic_agent.kernels import norm
from hypic_agent.kernels.config import KernelConfig
from hypic_agent.runtime.models.layers.norms import GatedRMSNorm, RMSNorm

DTYPES = [torch.float32, torch.bfloat16]
ANY_ROWS = KernelConfig(norm_fla_min_rows=0)  # modules: the fla path for inputs of any length


def _old_rms(x, w, eps, zero_centered):
    """The RMSNorm.forward body before the kernels/norm.py split (kept verbatim)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        return (y * (1.0 + w.float())).type_as(x)
    return w * y.to(x.dtype)


def _old_gated(x, z, w, eps):
    """The GatedRMSNorm.forward body before the split (kept verbatim)."""
    dtype = x.dtype
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = w * y.to(dtype)
    return (y * F.silu(z.float())).to(dtype)


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("shape", [(37, 64), (5, 3, 32)])
def test_rms_norm_bit_identical(dtype, zero_centered, shape):
    x = _rand(*shape, dtype=dtype, scale=3.0)
    mod = RMSNorm(shape[-1], 1e-6, zero_centered).to(dtype)
    with torch.no_grad():
        mod.weight.copy_(_rand(shape[-1], seed=1, scale=0.3) + (0.0 if zero_centered else 1.0))
    with torch.no_grad():
        ref = _old_rms(x, mod.weight, 1e-6, zero_centered)
        assert torch.equal(norm.rms_norm(x, mod.weight, 1e-6, zero_centered=zero_centered), ref)
        assert torch.equal(norm.rms_norm_torch(x, mod.weight, 1e-6, zero_centered), ref)
        out = mod(x)
    assert out.dtype == ref.dtype == dtype and torch.equal(out, ref)
    # with autograd (training) too
    assert torch.equal(mod(x), ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_bit_identical(dtype):
    x, z = _rand(11, 4, 32, dtype=dtype, scale=2.0), _rand(11, 4, 32, dtype=dtype, seed=2, scale=2.0)
    mod = GatedRMSNorm(32, 1e-6).to(dtype)
    with torch.no_grad():
        mod.weight.copy_(1.0 + _rand(32, seed=3, scale=0.3))
        ref = _old_gated(x, z, mod.weight, 1e-6)
        assert torch.equal(norm.gated_rms_norm(x, z, mod.weight, 1e-6), ref)
        assert torch.equal(mod(x, z), ref)
    assert mod(x, z).dtype == dtype and torch.equal(mod(x, z), ref)


def test_mixed_dtype_weight_keeps_reference_promotion():
    x, w = _rand(6, 16, dtype=torch.bfloat16), _rand(16, seed=1) + 1.0  # fp32 weight, bf16 x
    assert torch.equal(norm.rms_norm(x, w, 1e-6, zero_centered=False), _old_rms(x, w, 1e-6, False))
    assert norm.rms_norm(x, w, 1e-6, zero_centered=False).dtype == torch.float32
    assert norm.rms_norm(x, w, 1e-6, zero_centered=True).dtype == torch.bfloat16


def test_grads_flow_on_torch_path():
    mod = RMSNorm(16, 1e-6, True)
    gmod = GatedRMSNorm(16, 1e-6)
    x = _rand(4, 16).requires_grad_()
    (mod(x).sum() + gmod(x, x).sum()).backward()
    assert x.grad is not None and mod.weight.grad is not None and gmod.weight.grad is not None


def test_backend_torch_and_fla_on_cpu():
    x, w = _rand(3, 8), torch.zeros(8)
    assert torch.equal(norm.rms_norm(x, w, 1e-6, zero_centered=True, backend="torch"), _old_rms(x, w, 1e-6, True))
    with pytest.raises(ValueError):
        norm.rms_norm(x, w, 1e-6, zero_centered=True, backend="fla")


# ---------------------------------------------------------------- fla dispatch, faked on CPU


@pytest.fixture
def fake_fla(monkeypatch):
    """Route dispatch to a fake ``norm_fla`` (fp32 one-rounding math) and record its calls."""
    calls: list[tuple] = []

    def rms_norm_fla(x, weight, eps):
        calls.append(("rms", weight))
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    def gated_rms_norm_fla(x, z, weight, eps):
        calls.append(("gated", weight))
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return (y * F.silu(z.float())).to(x.dtype)

    fake = types.ModuleType("hypic_agent.kernels.norm.norm_fla")
    fake.rms_norm_fla = rms_norm_fla  # type: ignore[attr-defined]
    fake.gated_rms_norm_fla = gated_rms_norm_fla  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hypic_agent.kernels.norm.norm_fla", fake)
    monkeypatch.setattr(norm, "resolve_backend", lambda name, device: "fla")
    monkeypatch.setattr(norm, "FLA_ERRORS", {})
    return calls


def test_fla_used_only_without_autograd(fake_fla):
    mod = RMSNorm(16, 1e-6, True)
    mod.kernels = ANY_ROWS
    x = _rand(5, 16, dtype=torch.bfloat16)
    mod.to(torch.bfloat16)
    y = mod(x)  # grad enabled and weight requires grad: torch path
    assert fake_fla == [] and y.requires_grad
    with torch.no_grad():
        y = mod(x)
    assert [c[0] for c in fake_fla] == ["rms"]
    w1 = fake_fla[0][1]
    assert w1.dtype == torch.float32 and torch.equal(w1, 1.0 + mod.weight.float())
    assert (y.float() - _old_rms(x, mod.weight, 1e-6, True).float()).abs().max() < 2e-2
    gmod = GatedRMSNorm(16, 1e-6)
    gmod.kernels = ANY_ROWS
    with torch.inference_mode():
        gmod(_rand(2, 3, 16), _rand(2, 3, 16, seed=1))
    assert fake_fla[-1][0] == "gated" and fake_fla[-1][1] is gmod.weight


def test_plus_one_cache_invalidates(fake_fla):
    mod = RMSNorm(8, 1e-6, True)
    mod.kernels = ANY_ROWS
    x = _rand(2, 8)
    with torch.no_grad():
        mod(x)
        mod(x)
        assert fake_fla[0][1] is fake_fla[1][1]  # cached
        mod.weight.add_(0.5)  # in-place: version bump
        mod(x)
        assert torch.equal(fake_fla[2][1], torch.full((8,), 1.5))
        mod.weight.data = torch.full((8,), 2.0)  # new storage
        mod(x)
        assert torch.equal(fake_fla[3][1], torch.full((8,), 3.0))


def test_fla_failure_warns_once_and_falls_back(monkeypatch, caplog):
    broken = types.ModuleType("hypic_agent.kernels.norm.norm_fla")  # no functions: ImportError on use
    monkeypatch.setitem(sys.modules, "hypic_agent.kernels.norm.norm_fla", broken)
    monkeypatch.setattr(norm, "resolve_backend", lambda name, device: "fla")
    monkeypatch.setattr(norm, "FLA_ERRORS", {})
    x, z, w = _rand(4, 8), _rand(4, 8, seed=1), _rand(8, seed=2)
    with caplog.at_level(logging.WARNING, logger=norm.__name__), torch.no_grad():
        for _ in range(3):
            got = norm.rms_norm(x, w, 1e-6, zero_centered=False, min_rows=0)
            assert torch.equal(got, _old_rms(x, w, 1e-6, False))
            assert torch.equal(norm.gated_rms_norm(x, z, w, 1e-6, min_rows=0), _old_gated(x, z, w, 1e-6))
    assert set(norm.FLA_ERRORS) == {"rms_norm", "gated_rms_norm"}
    assert len([r for r in caplog.records if "fla" in r.getMessage()]) == 2  # one per op


def test_short_inputs_stay_on_torch(fake_fla):
    w = _rand(16, seed=3)
    with torch.no_grad():
        norm.rms_norm(_rand(5, 16), w, 1e-6, zero_centered=False, min_rows=6)  # 5 rows: torch
        assert fake_fla == []
        norm.rms_norm(_rand(2, 3, 16), w, 1e-6, zero_centered=False, min_rows=6)  # 6 rows: fla
        assert [c[0] for c in fake_fla] == ["rms"]
        norm.rms_norm(_rand(511, 16), w, 1e-6, zero_centered=False)  # the default: 512 rows
        assert len(fake_fla) == 1
        mod = GatedRMSNorm(16, 1e-6)  # a module reads its kernels' norm_fla_min_rows
        mod(_rand(511, 16), _rand(511, 16, seed=1))
        assert len(fake_fla) == 1
        mod.kernels = KernelConfig(norm_fla_min_rows=6)
        mod(_rand(6, 16), _rand(6, 16, seed=1))
    assert [c[0] for c in fake_fla] == ["rms", "gated"]


@pytest.mark.parametrize("d", [64, 256, 512])
def test_long_inputs_reach_fla_in_single_blocks_and_equal_one_call(fake_fla, monkeypatch, d):
    """fla's row-block norm kernels (D <= 512) autotune per block count: long inputs go in pieces of
    one block (``ROW_BLOCKS``), with the result of one call."""
    monkeypatch.setattr(norm, "ROW_BLOCKS", {"rms_norm": 16, "gated_rms_norm": 8})
    sizes: list[int] = []
    real = sys.modules["hypic_agent.kernels.norm.norm_fla"]
    rms, gated = real.rms_norm_fla, real.gated_rms_norm_fla
    monkeypatch.setattr(real, "rms_norm_fla", lambda x, w, eps: (sizes.append(x.shape[0]), rms(x, w, eps))[1])
    monkeypatch.setattr(
        real, "gated_rms_norm_fla", lambda x, z, w, eps: (sizes.append(x.shape[0]), gated(x, z, w, eps))[1]
    )
    g = torch.Generator().manual_seed(d)
    x = torch.randn(5, 9, d, generator=g)  # 45 rows
    z = torch.randn(5, 9, d, generator=g)
    w = torch.randn(d, generator=g)
    with torch.no_grad():
        got = norm.rms_norm(x, w, 1e-6, zero_centered=True, min_rows=0)
        assert sizes == [16, 16, 13]
        sizes.clear()
        got_gated = norm.gated_rms_norm(x, z, w, 1e-6, min_rows=0)
        assert sizes == [8, 8, 8, 8, 8, 5]
    torch.testing.assert_close(got, rms(x.reshape(-1, d), 1.0 + w, 1e-6).view_as(x))
    torch.testing.assert_close(got_gated, gated(x.reshape(-1, d), z.reshape(-1, d), w, 1e-6).view_as(x))


def test_wide_rows_go_to_fla_whole(fake_fla, monkeypatch):
    monkeypatch.setattr(norm, "ROW_BLOCKS", {"rms_norm": 16, "gated_rms_norm": 8})
    calls_before = len(fake_fla)
    with torch.no_grad():
        norm.rms_norm(torch.randn(40, 1024), torch.randn(1024), 1e-6, zero_centered=False, min_rows=0)
    assert len(fake_fla) - calls_before == 1  # D > 512: fla's other kernel, no block count in its key
