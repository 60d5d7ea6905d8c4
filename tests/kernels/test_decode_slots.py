"""In-place decode steps over state pools (``gdn_decode``, ``conv_decode``): the torch twins against
the existing per-request references, several steps against the prefill references, the Triton
kernels against the twins through Triton's CPU interpreter, and (``gpu``) the CUDA path at the
Qwen3.5-35B-A3B shape, also inside a CUDA graph replayed with other slots."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hypic_agent.kernels.conv import causal_conv1d, causal_conv1d_step
from hypic_agent.kernels.conv_decode import conv_decode_slots
from hypic_agent.kernels.gdn import gated_delta_rule, gated_delta_rule_step
from hypic_agent.kernels.gdn_decode import gdn_decode_slots
from tests.kernels.helpers import gdn_inputs, rel_err, run_in_interpreter

ROOT = Path(__file__).resolve().parents[2]
H, HV, K, V = 2, 4, 24, 40  # GVA, K and V not powers of two
S = 7
SLOTS = [5, -1, 0, 3]  # out of order, a padding row


def _pool(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _live(slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [i for i, s in enumerate(slots) if s >= 0]
    return torch.tensor(rows), torch.tensor([slots[i] for i in rows])


@pytest.mark.parametrize("l2norm,scale", [(True, None), (False, 0.3)])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_gdn_twin_matches_step(l2norm, scale, idx_dtype):
    x = gdn_inputs(len(SLOTS), H, HV, K, V, seed=1)
    pool = _pool(0, S, HV, K, V)
    before = pool.clone()
    slots = torch.tensor(SLOTS, dtype=idx_dtype)
    o = gdn_decode_slots(*x.values(), pool, slots, use_qk_l2norm=l2norm, scale=scale, backend="torch")
    rows, live = _live(SLOTS)
    ro, rs = gated_delta_rule_step(*(t[rows] for t in x.values()), before[live], l2norm, scale=scale, backend="torch")
    assert o.shape == (len(SLOTS), HV, V) and o.dtype == x["q"].dtype
    assert (o[rows] - ro).abs().max() < 1e-6 and (pool[live] - rs).abs().max() < 1e-6
    assert torch.equal(o[1], torch.zeros(HV, V))  # the padding row
    untouched = [s for s in range(S) if s not in SLOTS]
    assert torch.equal(pool[untouched], before[untouched])
    # the step changed the live slots, each by its own row (a swapped slot would be far off)
    assert all(rel_err(pool[s], before[s]) > 1e-2 for s in live.tolist())
    assert rel_err(pool[5], rs[1]) > 1e-2 and rel_err(o[0], ro[1]) > 1e-2


def test_gdn_all_padding_touches_nothing():
    x = gdn_inputs(2, H, HV, K, V, seed=2)
    pool = _pool(0, S, HV, K, V)
    before = pool.clone()
    o = gdn_decode_slots(*x.values(), pool, torch.tensor([-1, -1]), backend="torch")
    assert torch.equal(o, torch.zeros(2, HV, V)) and torch.equal(pool, before)


def test_gdn_steps_match_prefill():
    """L steps of 3 requests (rows shuffled every step, a padding row) equal one chunked prefill of
    each request's L tokens from its slot's initial state."""
    L, slot_of = 9, [4, 1, 6]
    seqs = [gdn_inputs(L, H, HV, K, V, seed=10 + i) for i in range(3)]
    pool = _pool(3, S, HV, K, V) * 0.5
    h0 = pool[slot_of].clone()
    untouched = [s for s in range(S) if s not in slot_of]
    before = pool.clone()
    outs = torch.zeros(3, L, HV, V)
    gen = torch.Generator().manual_seed(0)
    for t in range(L):
        order = torch.randperm(3, generator=gen).tolist()
        rows = [*order[:1], -1, *order[1:]]  # request index per row, -1 = padding
        x = {n: torch.stack([seqs[r][n][t] if r >= 0 else torch.ones_like(seqs[0][n][t]) for r in rows])
             for n in seqs[0]}  # fmt: skip
        slots = torch.tensor([slot_of[r] if r >= 0 else -1 for r in rows])
        o = gdn_decode_slots(*x.values(), pool, slots, backend="torch")
        assert torch.equal(o[1], torch.zeros(HV, V))
        for i, r in enumerate(rows):
            if r >= 0:
                outs[r, t] = o[i]
    packed = {n: torch.cat([s[n] for s in seqs]) for n in seqs[0]}
    cu = torch.tensor([0, L, 2 * L, 3 * L], dtype=torch.int32)
    ro, rs = gated_delta_rule(**packed, cu_seqlens=cu, initial_state=h0, backend="torch")
    assert rel_err(outs.reshape(3 * L, HV, V), ro) < 1e-5 and rel_err(pool[slot_of], rs) < 1e-5
    assert torch.equal(pool[untouched], before[untouched])


C, W = 20, 4


@pytest.mark.parametrize("with_bias,act", [(True, "silu"), (False, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_twin_matches_step(with_bias, act, dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(len(SLOTS), C, generator=g).to(dtype)
    w, b = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    bias = b if with_bias else None
    pool = _pool(6, S, C, W - 1, dtype=dtype)
    before = pool.clone()
    y = conv_decode_slots(x, pool, torch.tensor(SLOTS, dtype=torch.int32), w, bias, activation=act, backend="torch")
    rows, live = _live(SLOTS)
    ry, rs = causal_conv1d_step(x[rows], before[live], w, bias, act)
    assert y.dtype == dtype and (y[rows].float() - ry.float()).abs().max() < 1e-6
    assert torch.equal(pool[live], rs) and torch.equal(y[1], torch.zeros(C, dtype=dtype))
    # the shift: the oldest input dropped, the new one last
    assert torch.equal(pool[live][..., :-1], before[live][..., 1:]) and torch.equal(pool[live][..., -1], x[rows])
    untouched = [s for s in range(S) if s not in SLOTS]
    assert torch.equal(pool[untouched], before[untouched])


def test_conv_steps_match_prefill():
    L, slot_of = 6, [2, 0, 5]
    g = torch.Generator().manual_seed(8)
    xs = torch.randn(3, L, C, generator=g)
    w, b = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    pool = _pool(9, S, C, W - 1)
    h0 = pool[slot_of].clone()
    ys = torch.zeros(3, L, C)
    for t in range(L):
        rows = [2, -1, 0, 1]
        x = torch.stack([xs[r, t] if r >= 0 else torch.ones(C) for r in rows])
        y = conv_decode_slots(
            x, pool, torch.tensor([slot_of[r] if r >= 0 else -1 for r in rows]), w, b, backend="torch"
        )
        for i, r in enumerate(rows):
            if r >= 0:
                ys[r, t] = y[i]
    cu = torch.tensor([0, L, 2 * L, 3 * L], dtype=torch.int32)
    ry, rf = causal_conv1d(xs.reshape(3 * L, C), w, b, cu_seqlens=cu, initial_state=h0, backend="torch")
    assert (ys.reshape(3 * L, C) - ry).abs().max() < 1e-5 and torch.equal(pool[slot_of], rf)


def test_argument_checks():
    x = gdn_inputs(2, H, HV, K, V)
    pool = torch.zeros(S, HV, K, V)
    with pytest.raises(ValueError, match="state_pool"):
        gdn_decode_slots(*x.values(), pool.double(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="slots"):
        gdn_decode_slots(*x.values(), pool, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="conv_pool"):
        conv_decode_slots(torch.zeros(2, C), torch.zeros(S, C, W), torch.tensor([0, 1]), torch.zeros(C, W))
    with pytest.raises(ValueError, match="activation"):
        conv_decode_slots(torch.zeros(2, C), torch.zeros(S, C, W - 1), torch.tensor([0, 1]), torch.zeros(C, W),
                          activation="gelu")  # fmt: skip


# ---- Triton kernels vs twins, through the interpreter (a subprocess each: TRITON_INTERPRET is read at import)

GDN_TRITON = """
from unittest import mock
import torch
from hypic_agent.kernels import gdn_decode
from hypic_agent.kernels.gdn_decode import gdn_decode_slots, gdn_decode_slots_torch
from hypic_agent.kernels.gdn_decode.gdn_decode_triton import gdn_decode_slots_triton
from tests.kernels.helpers import gdn_inputs, rel_err
S, slots_l = 7, [5, -1, 0, 3, 6]
for (H, HV, K, V), dt, l2, scale, idx_dt, bv in (
    ((2, 4, 24, 40), torch.float32, True, None, torch.int32, 16),   # GVA, masked K and V, 3 V blocks
    ((3, 3, 16, 8), torch.bfloat16, False, 0.7, torch.int64, 8),     # no GVA, bf16 inputs, 1 V block
    ((1, 2, 256, 200), torch.float32, True, None, torch.int32, 64),  # the largest K; V = 200 masked
):
    x = gdn_inputs(len(slots_l), H, HV, K, V, seed=3, dtype=dt)
    pool = torch.randn(S, HV, K, V, generator=torch.Generator().manual_seed(4))
    ref_pool = pool.clone()
    slots = torch.tensor(slots_l, dtype=idx_dt)
    ro = gdn_decode_slots_torch(*x.values(), ref_pool, slots, l2, scale)
    before = pool.clone()
    o = gdn_decode_slots_triton(*x.values(), pool, slots, l2, scale, bv=bv)
    assert o.dtype == dt and rel_err(o.float(), ro.float()) < (1e-6 if dt == torch.float32 else 1e-2), rel_err(o, ro)
    assert rel_err(pool, ref_pool) < 1e-6, rel_err(pool, ref_pool)
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])  # untouched slots, bit for bit
    assert min(rel_err(pool[s], before[s]) for s in (0, 3, 5, 6)) > 1e-2
# q, k, v as row-strided views of one packed projection; g, beta as column views: read in place
H, HV, K, V = 2, 4, 24, 40
x = gdn_inputs(5, H, HV, K, V, seed=6)
qkv = torch.cat([x["q"].reshape(5, -1), x["k"].reshape(5, -1), x["v"].reshape(5, -1)], 1)
q_, k_, v_ = torch.split(qkv, [H * K, H * K, HV * V], 1)
gb = torch.stack([x["g"], x["beta"]], -1)
views = dict(q=q_.view(5, H, K), k=k_.view(5, H, K), v=v_.view(5, HV, V), g=gb[..., 0], beta=gb[..., 1])
assert not views["q"].is_contiguous() and not views["g"].is_contiguous()
pool = torch.randn(S, HV, K, V)
ref_pool = pool.clone()
slots = torch.tensor(slots_l)
ro = gdn_decode_slots_torch(*x.values(), ref_pool, slots)
# the dispatcher's Triton branch, with the default launch shape
with mock.patch.object(gdn_decode, "resolve_triton", lambda b, d: True):
    o = gdn_decode_slots(*views.values(), pool, slots)
assert rel_err(o, ro) < 1e-6 and rel_err(pool, ref_pool) < 1e-6, (rel_err(o, ro), rel_err(pool, ref_pool))
"""

CONV_TRITON = """
import torch
from unittest import mock
from hypic_agent.kernels import conv_decode
from hypic_agent.kernels.conv_decode import conv_decode_slots, conv_decode_slots_torch
from hypic_agent.kernels.conv_decode.conv_decode_triton import conv_decode_slots_triton
g = torch.Generator().manual_seed(0)
S, C, slots_l = 6, 200, [4, -1, 1, 5]
for W, dt, act, with_bias, idx_dt in ((4, torch.float32, "silu", True, torch.int32),
                                      (2, torch.bfloat16, None, False, torch.int64)):
    x = torch.randn(len(slots_l), C, generator=g).to(dt)
    w, b = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    bias = b if with_bias else None
    pool = torch.randn(S, C, W - 1, generator=g).to(dt)
    before, ref_pool = pool.clone(), pool.clone()
    slots = torch.tensor(slots_l, dtype=idx_dt)
    ry = conv_decode_slots_torch(x, ref_pool, slots, w, bias, act)
    y = conv_decode_slots_triton(x, pool, slots, w, bias, act == "silu", bc=128)  # two channel blocks, masked
    tol = 1e-5 if dt == torch.float32 else 1e-2
    err = (y.float() - ry.float()).abs().max()
    assert y.dtype == dt and torch.allclose(y.float(), ry.float(), atol=tol, rtol=tol), err
    assert torch.equal(pool, ref_pool) and torch.equal(y[1], torch.zeros_like(y[1]))
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]]) and not torch.equal(pool[4], before[4])
# the dispatcher's Triton branch with a row-strided x
xw = torch.randn(4, 2 * C, generator=g)
w = torch.randn(C, 4, generator=g)
pool = torch.randn(S, C, 3, generator=g)
ref_pool = pool.clone()
ry = conv_decode_slots_torch(xw[:, :C], ref_pool, torch.tensor(slots_l), w, None, "silu")
with mock.patch.object(conv_decode, "resolve_triton", lambda b, d: True):
    y = conv_decode_slots(xw[:, :C], pool, torch.tensor(slots_l), w)
assert torch.allclose(y, ry, atol=1e-5) and torch.equal(pool, ref_pool)
"""


@pytest.mark.parametrize("name,script", [("gdn_decode", GDN_TRITON), ("conv_decode", CONV_TRITON)])
def test_triton_kernel_matches_twin(name, script):
    run_in_interpreter(name, script)


# ---- GPU: the CUDA path (Triton kernels) at the Qwen3.5-35B-A3B shape, bf16 model dtype

QH, QHV, QK, QV, QC, QW, QS = 16, 32, 128, 128, 8192, 4, 80
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _gpu_slots(n: int, seed: int) -> torch.Tensor:
    """n distinct slots of QS in random order, the last row padding when n > 1."""
    s = torch.randperm(QS, generator=torch.Generator().manual_seed(seed))[:n]
    if n > 1:
        s[-1] = -1
    return s.to(device="cuda", dtype=torch.int32)


def _gdn_gpu_inputs(n: int, seed: int) -> dict[str, torch.Tensor]:
    x = gdn_inputs(n, QH, QHV, QK, QV, seed=seed, device="cuda", dtype=torch.bfloat16)
    x["beta"] = x["beta"].bfloat16()
    return x


def _time_us(fn, reps: int = 50) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _check_gdn(o, ro, pool, ref_pool, before, slots) -> None:
    live = slots[slots >= 0].long()
    untouched = torch.ones(QS, dtype=torch.bool, device="cuda")
    untouched[live] = False
    eo, es = rel_err(o.float(), ro.float()), rel_err(pool[live], ref_pool[live])
    print(f"gdn decode N={slots.numel()}: rel err o {eo:.2e} state {es:.2e}")
    assert o.dtype == torch.bfloat16 and eo < 5e-3 and es < 1e-4
    assert torch.equal(pool[untouched], before[untouched])
    assert min(rel_err(pool[s], before[s]) for s in live.tolist()) > 1e-3
    if (slots < 0).any():
        assert torch.equal(o[-1], torch.zeros_like(o[-1]))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n", [1, 8, 64])
def test_gpu_gdn_decode_matches_twin(n):
    x, slots = _gdn_gpu_inputs(n, seed=n), _gpu_slots(n, seed=n)
    pool = torch.randn(QS, QHV, QK, QV, device="cuda")
    before, ref_pool = pool.clone(), pool.clone()
    ro = gdn_decode_slots(*x.values(), ref_pool, slots, backend="torch")
    o = gdn_decode_slots(*x.values(), pool, slots, backend="auto")
    _check_gdn(o, ro, pool, ref_pool, before, slots)
    us = _time_us(lambda: gdn_decode_slots(*x.values(), pool, slots))
    gb = 2 * int((slots >= 0).sum()) * QHV * QK * QV * 4 / 1e9
    print(f"gdn decode N={n}: {us:.1f} us, state traffic {gb / (us * 1e-6):.0f} GB/s")


def _check_conv(y, ry, pool, ref_pool, before, slots) -> None:
    live = slots[slots >= 0].long()
    untouched = torch.ones(QS, dtype=torch.bool, device="cuda")
    untouched[live] = False
    ey = rel_err(y.float(), ry.float())
    print(f"conv decode N={slots.numel()}: rel err y {ey:.2e}")
    assert y.dtype == torch.bfloat16 and ey < 5e-3
    assert torch.equal(pool, ref_pool) and torch.equal(pool[untouched], before[untouched])
    if (slots < 0).any():
        assert torch.equal(y[-1], torch.zeros_like(y[-1]))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_conv_decode_matches_twin(n, with_bias):
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, QC, device="cuda", generator=g).bfloat16()
    w = (torch.randn(QC, QW, device="cuda", generator=g) * 0.5).bfloat16()
    bias = torch.randn(QC, device="cuda", generator=g).bfloat16() if with_bias else None
    pool = torch.randn(QS, QC, QW - 1, device="cuda", generator=g).bfloat16()
    slots = _gpu_slots(n, seed=100 + n)
    before, ref_pool = pool.clone(), pool.clone()
    ry = conv_decode_slots(x, ref_pool, slots, w, bias, backend="torch")
    y = conv_decode_slots(x, pool, slots, w, bias, backend="auto")
    _check_conv(y, ry, pool, ref_pool, before, slots)
    print(f"conv decode N={n}: {_time_us(lambda: conv_decode_slots(x, pool, slots, w, bias)):.1f} us")


def _capture(fn):
    """Warm up (compiles the kernel) on a side stream, then capture ``fn`` into a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.gpu
@needs_cuda
def test_gpu_gdn_decode_cuda_graph_replay():
    n = 8
    static = _gdn_gpu_inputs(n, seed=0)
    slots = _gpu_slots(n, seed=0)
    pool = torch.randn(QS, QHV, QK, QV, device="cuda")
    graph, o = _capture(lambda: gdn_decode_slots(*static.values(), pool, slots))
    for rnd in range(1, 4):  # new inputs and new slots each replay, written into the captured buffers
        new = _gdn_gpu_inputs(n, seed=rnd)
        for name, t in new.items():
            static[name].copy_(t)
        slots.copy_(_gpu_slots(n, seed=rnd))
        pool.normal_()
        before, ref_pool = pool.clone(), pool.clone()
        ro = gdn_decode_slots(*static.values(), ref_pool, slots, backend="torch")
        graph.replay()
        torch.cuda.synchronize()
        _check_gdn(o, ro, pool, ref_pool, before, slots)


@pytest.mark.gpu
@needs_cuda
def test_gpu_conv_decode_cuda_graph_replay():
    n = 8
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, QC, device="cuda", generator=g).bfloat16()
    w = torch.randn(QC, QW, device="cuda", generator=g).bfloat16()
    pool = torch.randn(QS, QC, QW - 1, device="cuda", generator=g).bfloat16()
    slots = _gpu_slots(n, seed=0)
    graph, y = _capture(lambda: conv_decode_slots(x, pool, slots, w))
    for rnd in range(1, 4):
        x.normal_(generator=g)
        slots.copy_(_gpu_slots(n, seed=rnd))
        pool.normal_(generator=g)
        before, ref_pool = pool.clone(), pool.clone()
        ry = conv_decode_slots(x, ref_pool, slots, w, backend="torch")
        graph.replay()
        torch.cuda.synchronize()
        _check_conv(y, ry, pool, ref_pool, before, slots)
