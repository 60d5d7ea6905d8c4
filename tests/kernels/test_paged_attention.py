"""Paged decode attention: the torch twin against dense attention over each sequence's keys, the
dispatcher's argument checks, and (through Triton's CPU interpreter, in a subprocess) the Triton
kernel against the twin. The GPU run (bf16, Qwen3.5 shape, CUDA graphs) is
``test_gpu_paged_attention.py``.

The page pools are built so that a kernel reading what it must not shows: unused pages and the
unused slots of a sequence's last page hold NaN, and block-table entries past a sequence's pages
hold an out-of-range page id.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hypic_agent.kernels.attention import attention
from hypic_agent.kernels.paged_attention import paged_decode_attention, paged_decode_attention_torch
from tests.kernels.helpers import rel_err, run_in_interpreter

ROOT = Path(__file__).resolve().parents[2]
UNUSED_PAGE = 1_000_000  # block-table entries past a sequence's pages: reading one would fail


def paged_inputs(
    lens: list[int],
    Hq: int,
    Hkv: int,
    D: int,
    Dv: int,
    page_size: int,
    *,
    seed: int = 0,
    spare_pages: int = 3,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Random keys / values per sequence, scattered into a page pool at shuffled page ids.

    Returns the dispatcher's tensors (``q``, ``k_cache``, ``v_cache``, ``block_table``,
    ``context_lens``) and the dense keys ``[L, Hkv, D]`` and values ``[L, Hkv, Dv]`` per sequence.
    """
    g = torch.Generator().manual_seed(seed)
    need = [-(-L // page_size) for L in lens]
    P = sum(need) + spare_pages
    ids = torch.randperm(P, generator=g)  # pages out of order, spare ones among them
    k_cache = torch.full((P, page_size, Hkv, D), float("nan"))
    v_cache = torch.full((P, page_size, Hkv, Dv), float("nan"))
    block_table = torch.full((len(lens), max(need, default=0) + 1), UNUSED_PAGE, dtype=torch.int32)
    ks, vs, used = [], [], 0
    for i, L in enumerate(lens):
        k, v = torch.randn(L, Hkv, D, generator=g), torch.randn(L, Hkv, Dv, generator=g)
        pages = ids[used : used + need[i]]
        used += need[i]
        block_table[i, : need[i]] = pages.to(torch.int32)
        page_of_key = pages.repeat_interleave(page_size)[:L]
        slot_of_key = torch.arange(L) % page_size
        k_cache[page_of_key, slot_of_key] = k
        v_cache[page_of_key, slot_of_key] = v
        ks.append(k.to(dtype))
        vs.append(v.to(dtype))
    x = {
        "q": torch.randn(len(lens), Hq, D, generator=g),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_table": block_table,
        "context_lens": torch.tensor(lens, dtype=torch.int32),
    }
    x = {n: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for n, t in x.items()}
    return x, ks, vs


def dense_reference(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """fp64 softmax attention of query ``i`` over ``ks[i]`` / ``vs[i]``; zeros where there are no keys."""
    N, Hq, _ = q.shape
    out = torch.zeros(N, Hq, vs[0].shape[-1] if vs else 0, dtype=torch.float64)
    for i, (k, v) in enumerate(zip(ks, vs)):
        if len(k) == 0:
            continue
        kv_head = torch.arange(Hq) // (Hq // k.shape[1])  # query head h reads kv head h // G
        s = torch.einsum("hd,lhd->hl", q[i].double().cpu(), k.double()[:, kv_head]) * scale
        out[i] = torch.einsum("hl,lhv->hv", torch.softmax(s, -1), v.double()[:, kv_head])
    return out


LENS = [37, 0, 1, 15, 16, 17, 50, 64]  # page boundaries at 16 (and 4, 8); an empty and a one-key sequence


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (9, 3), (16, 2)])  # GQA groups 1, 3, 8
@pytest.mark.parametrize("page_size,D,Dv", [(16, 24, 40), (4, 64, 64), (8, 40, 24)])
def test_twin_matches_dense_attention(Hq, Hkv, page_size, D, Dv):
    x, ks, vs = paged_inputs(LENS, Hq, Hkv, D, Dv, page_size, seed=Hq + page_size)
    scale = D**-0.5 * 1.7
    out = paged_decode_attention_torch(**x, scale=scale)
    ref = dense_reference(x["q"], ks, vs, scale)
    assert out.shape == (len(LENS), Hq, Dv) and out.dtype == torch.float32
    assert not out.isnan().any()  # the NaN slots and pages were never read
    assert torch.equal(out[1], torch.zeros(Hq, Dv))  # length 0: zeros
    G = Hq // Hkv
    assert torch.equal(out[2], vs[2][0].repeat_interleave(G, dim=0))  # one key: its value, per group
    for i, L in enumerate(LENS):
        if L:
            assert rel_err(out[i], ref[i]) < 1e-5, (i, L, rel_err(out[i], ref[i]))
    # the same through the dispatcher (CPU: the twin)
    assert torch.equal(paged_decode_attention(**x, scale=scale), out)


def test_twin_matches_varlen_attention():
    """Against the project's varlen attention over the concatenated keys (the query is the last
    token of its sequence: bottom-right causal)."""
    lens = [20, 1, 33, 0, 48]
    x, ks, vs = paged_inputs(lens, 6, 2, 32, 32, 16, seed=4)
    cu_k = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_q = torch.arange(len(lens) + 1, dtype=torch.int32)
    ref = attention(x["q"], torch.cat(ks), torch.cat(vs), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=0.2,
                    backend="torch")  # fmt: skip
    out = paged_decode_attention_torch(**x, scale=0.2)
    assert rel_err(out, ref) < 1e-5 and torch.equal(out[3], torch.zeros(6, 32))


def test_twin_dtype_and_scale():
    x, _, _ = paged_inputs([30, 5], 4, 2, 16, 16, 8, seed=2)
    out1 = paged_decode_attention_torch(**x, scale=0.1)
    out2 = paged_decode_attention_torch(**x, scale=1.0)
    assert rel_err(out1, out2) > 1e-2  # the scale is applied
    xb = {n: t.bfloat16() if t.is_floating_point() else t for n, t in x.items()}
    ob = paged_decode_attention_torch(**xb, scale=0.1)
    assert ob.dtype == torch.bfloat16 and rel_err(ob.float(), out1) < 1e-2


def test_twin_rejects_context_past_the_table():
    x, _, _ = paged_inputs([10], 2, 2, 8, 8, 4)  # 3 pages + 1 spare column: up to 16 keys
    x["context_lens"] = torch.tensor([17], dtype=torch.int32)
    with pytest.raises(ValueError, match="context_lens"):
        paged_decode_attention_torch(**x, scale=1.0)


def _bad(**changes):
    x, _, _ = paged_inputs([10, 3], 4, 2, 8, 8, 4)
    x.update(changes)
    return x


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"q": torch.randn(2, 32)}, "need q"),
        ({"block_table": torch.zeros(2, 4, 1, dtype=torch.int32)}, "need q"),
        ({"q": torch.randn(2, 3, 8)}, "multiple of Hkv"),
        ({"q": torch.randn(2, 4, 16)}, "head dim"),
        ({"v_cache": torch.randn(7, 4, 1, 8)}, "same \\[P, page_size, Hkv\\]"),
        ({"block_table": torch.zeros(3, 4, dtype=torch.int32)}, "one row per sequence"),
        ({"context_lens": torch.zeros(1, dtype=torch.int32)}, "one row per sequence"),
        ({"k_cache": torch.randn(7, 6, 2, 8), "v_cache": torch.randn(7, 6, 2, 8)}, "power of two"),
        ({"k_cache": torch.randn(7, 4, 2, 8).bfloat16()}, "one floating dtype"),
        ({"block_table": torch.zeros(2, 4)}, "block_table needs an integer"),
        ({"context_lens": torch.tensor([1.0, 2.0])}, "context_lens needs an integer"),
        ({"k_cache": torch.randn(7, 4, 2, 16)[..., ::2]}, "unit stride"),
    ],
)
def test_dispatcher_rejects_bad_arguments(changes, match):
    with pytest.raises(ValueError, match=match):
        paged_decode_attention(**_bad(**changes), scale=1.0)


def test_dispatcher_rejects_bad_options():
    x = _bad()
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention(**x, scale=1.0, num_splits=0)
    with pytest.raises(ValueError, match="unknown kernel backend"):
        paged_decode_attention(**x, scale=1.0, backend="cuda")
    with pytest.raises(ValueError, match="needs CUDA"):  # the Triton kernel on CPU tensors
        paged_decode_attention(**x, scale=1.0, backend="fla")


INTERPRETER = """
import torch
from unittest import mock
import hypic_agent.kernels.paged_attention as pa
from hypic_agent.kernels.paged_attention import paged_decode_attention_torch
from hypic_agent.kernels.paged_attention.paged_attention_triton import paged_decode_attention_triton
from tests.kernels.helpers import rel_err
from tests.kernels.test_paged_attention import paged_inputs

def check(o, ref, lens, what):
    assert o.shape == ref.shape and o.dtype == ref.dtype and not o.isnan().any(), what
    for i, L in enumerate(lens):
        if L == 0:
            assert torch.equal(o[i], torch.zeros_like(o[i])), (what, i)
        else:
            assert rel_err(o[i], ref[i]) < 1e-5, (what, i, L, rel_err(o[i], ref[i]))

# GQA group 3 (rows padded to 16), D 24 / Dv 40 (padded to 32 / 64), 16-key pages; tiles smaller
# than, equal to and larger than a page; one split, splits over several tiles, more splits than tiles
lens = [0, 1, 15, 16, 17, 50, 100]
x, _, _ = paged_inputs(lens, 6, 2, 24, 40, 16, seed=1)
ref = paged_decode_attention_torch(**x, scale=0.3)
for ns in (1, 3, 8):
    for bn in (8, 16, 32):
        o = paged_decode_attention_triton(**x, scale=0.3, num_splits=ns, block=(bn, 2))
        check(o, ref, lens, (ns, bn))
# group 8 with 4-key pages; group 1 with D 64
for lens, Hq, Hkv, D, Dv, ps in (([37, 0, 5], 8, 1, 32, 16, 4), ([9, 64], 2, 2, 64, 64, 8)):
    x, _, _ = paged_inputs(lens, Hq, Hkv, D, Dv, ps, seed=2)
    ref = paged_decode_attention_torch(**x, scale=0.125)
    for ns in (1, 4):
        check(paged_decode_attention_triton(**x, scale=0.125, num_splits=ns, block=(16, 2)), ref, lens, (Hq, ns))
# through the dispatcher (Triton branch forced): default splits and tile, a strided q, int64 lengths
lens = [40, 0, 3]
x, _, _ = paged_inputs(lens, 9, 3, 24, 24, 8, seed=3)
x["q"] = torch.randn(3, 9, 48)[:, :, 5:29]
x["context_lens"] = x["context_lens"].long()
ref = paged_decode_attention_torch(**x, scale=0.2)
with mock.patch.object(pa, "resolve_triton", lambda b, d: True):
    check(pa.paged_decode_attention(**x, scale=0.2), ref, lens, "dispatcher")
    check(pa.paged_decode_attention(**x, scale=0.2, num_splits=5), ref, lens, "dispatcher ns=5")
"""


def test_triton_kernel_matches_twin_in_interpreter():
    run_in_interpreter("paged_decode_attention", INTERPRETER)
