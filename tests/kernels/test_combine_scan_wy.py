"""WY combine scan: the host plan (steps, chunk sizes) and the torch twin of the chunk factors. The
Triton kernels against the twins: test_triton_interpreter.py (CPU) and test_gpu_gdn.py (CUDA)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.combine_scan import (
    choose_chunk_size,
    merge_steps,
    plan_steps,
    tables_from_host,
    wy_factors_torch,
)
from hypic_agent.kernels.gdn import gdn_torch
from tests.kernels.helpers import gdn_inputs, rel_err

CPU = torch.device("cpu")


def test_steps_pair_each_chunk_with_the_body_after_it():
    # body, piece of 40 (three 16-token chunks), body, body, empty piece, piece of 5
    meta = [(1, 0, 0), (0, 0, 40), (1, 0, 0), (1, 0, 0), (0, 40, 40), (0, 40, 45)]
    ptrs = torch.arange(2 * len(meta) * 2).reshape(2, len(meta), 2)  # two layers
    st = plan_steps(meta, ptrs, CPU, chunk_size=16)
    assert st.chunks.tolist() == [[0, 16], [16, 32], [32, 40], [40, 45]]
    assert st.meta.tolist() == [
        [0, 0, -1, 1],  # the leading body alone
        [0, 16, 0, 0],
        [16, 32, 1, 0],
        [32, 40, 2, 1],  # the last chunk of the piece carries the body after it
        [0, 0, -1, 1],  # the second body in a row gets a step of its own
        [40, 45, 3, 0],
    ]
    body_links = [0, -1, -1, 2, 3, -1]
    for s, link in enumerate(body_links):
        want = ptrs[:, link] if link >= 0 else torch.zeros(2, 2, dtype=torch.int64)
        assert torch.equal(st.ptrs[:, s], want), s


def test_merged_steps_shift_each_request_to_its_rows_and_bound_its_steps():
    # request A (rows 0..20): body, piece of 20; request B (rows 20..29): piece of 4, body, piece of 5
    a_meta, b_meta = [(1, 0, 0), (0, 0, 20)], [(0, 0, 4), (1, 0, 0), (0, 4, 9)]
    a_ptrs = torch.tensor([[[11, 12], [0, 0]], [[13, 14], [0, 0]]])  # two layers
    b_ptrs = torch.tensor([[[0, 0], [21, 22], [0, 0]], [[0, 0], [23, 24], [0, 0]]])
    tabs = [tables_from_host(m, p, torch.float32, CPU) for m, p in ((a_meta, a_ptrs), (b_meta, b_ptrs))]
    st = merge_steps(tabs, [0, 20], CPU)
    assert st.chunk_size == 16
    assert st.chunks.tolist() == [[0, 16], [16, 20], [20, 24], [24, 29]]
    assert st.meta.tolist() == [
        [0, 0, -1, 1],  # A's leading body
        [0, 16, 0, 0],
        [16, 20, 1, 0],
        [20, 24, 2, 1],  # B's first piece (its rows shifted by 20) carries B's body
        [24, 29, 3, 0],
    ]
    assert st.bounds.tolist() == [0, 3, 5]
    assert st.ptrs[1].tolist() == [[13, 14], [0, 0], [0, 0], [23, 24], [0, 0]]  # layer 1's pairs, per step
    with pytest.raises(ValueError, match="one row offset per table"):
        merge_steps(tabs, [0], CPU)


def test_chunk_size_follows_the_piece_lengths():
    assert choose_chunk_size([8] * 19 + [50]) == 16  # seam windows and a question
    assert choose_chunk_size([50]) == 16  # w = 0: only the question
    assert choose_chunk_size([1000]) == 64  # a long question: fewer, larger steps
    assert choose_chunk_size([]) == 16
    assert plan_steps([(0, 0, 1000)], torch.zeros(1, 1, 2, dtype=torch.int64), CPU).chunk_size == 64


@pytest.mark.parametrize("n", [1, 7, 16])
def test_factors_twin_reproduces_the_chunk_from_any_state(n):
    """A chunk entered with state h: o = ol + qp h and h' = gam h + kd^T (u - w h), as the token loop."""
    H, HV, K, V = 2, 4, 16, 8
    x = gdn_inputs(n, H, HV, K, V, seed=n)
    w, kd, qp, u, ol, gam = wy_factors_torch(**x, chunks=torch.tensor([[0, n]]), chunk_size=16)
    h = torch.randn(HV, K, V, generator=torch.Generator().manual_seed(1))
    q, k, v, g, b = gdn_torch.prepare(**x, use_qk_l2norm=True, scale=None)
    ro, rh = gdn_torch.recurrent(q[None], k[None], v[None], g[None], b[None], h[None])
    o = ol + torch.einsum("thk,hkv->thv", qp, h)
    d = u - torch.einsum("thk,hkv->thv", w, h)
    h2 = gam[0][:, None, None] * h + torch.einsum("thk,thv->hkv", kd, d)
    assert rel_err(o, ro[0]) < 1e-5 and rel_err(h2, rh[0]) < 1e-5


def test_factors_twin_rejects_oversized_chunks():
    x = gdn_inputs(20, 2, 4, 16, 8)
    with pytest.raises(ValueError, match=r"1\.\.16 tokens"):
        wy_factors_torch(**x, chunks=torch.tensor([[0, 20]]), chunk_size=16)
