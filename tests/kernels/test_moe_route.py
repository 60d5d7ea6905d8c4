"""MoE routing: the router's softmax top-k and the expert-sorted row layout, torch twins against
direct definitions, the Triton kernels against the twins (interpreter on CPU, CUDA when present)."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.kernels.moe_route import align, align_torch, max_blocks, router_topk, router_topk_torch
from tests.kernels.helpers import run_in_interpreter


def test_router_topk_torch_picks_the_largest_probabilities_and_renormalizes():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 5.0]])
    w, i = router_topk_torch(logits, 2, renormalize=False)
    p = torch.softmax(logits, -1)
    assert i.tolist() == [[1, 2], [3, 0]]
    torch.testing.assert_close(w, torch.stack([p[0, [1, 2]], p[1, [3, 0]]]))
    w, _ = router_topk_torch(logits, 2, renormalize=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    torch.testing.assert_close(w[0, 0] / w[0, 1], torch.tensor(torch.e))  # exp(2 - 1)


def test_align_groups_slots_by_expert_in_slot_order_padded_to_blocks():
    ids, be = align_torch(torch.tensor([[2, 0], [2, 1], [2, 0]]), 4, 2)
    assert ids.tolist() == [1, 5, 3, 6, 0, 2, 4, 6] + [6] * 6 and be.tolist() == [0, 1, 2, 2, -1, -1, -1]
    assert len(be) == max_blocks(6, 4, 2)


def test_router_topk_refuses_a_k_above_the_experts():
    with pytest.raises(ValueError, match="k <= E"):
        router_topk(torch.zeros(3, 4), 5, renormalize=True)


INTERPRETER = """
import torch
from hypic_agent.kernels.moe_route import align_torch, router_topk_torch
from hypic_agent.kernels.moe_route.moe_route_triton import align_triton, router_topk_triton
g = torch.Generator().manual_seed(0)
for T, E, k, renorm in ((1, 256, 8, True), (5, 60, 4, False), (3, 7, 7, True)):
    logits = torch.randn(T, E + 3, generator=g)[:, 2:-1]  # fp32: no ties; rows strided as a fused GEMM's slice
    w, i = router_topk_triton(logits, k, renorm)
    rw, ri = router_topk_torch(logits, k, renorm)
    assert torch.equal(i, ri), (T, E, k, i, ri)
    assert (w - rw).abs().max() < 1e-6, (T, E, k)
for T, K, E, block, used in ((1, 8, 256, 16, 256), (9, 2, 6, 4, 6), (40, 4, 64, 16, 3), (50, 2, 5, 2, 5)):
    idx = torch.stack([torch.randperm(used, generator=g)[:K] for _ in range(T)])  # m > one chunk; idle experts
    ids, be = align_triton(idx, E, block)
    rids, rbe = align_torch(idx, E, block)
    assert torch.equal(be, rbe), (T, K, E, block, be, rbe)
    assert torch.equal(ids, rids), (T, K, E, block)
"""


def test_triton_routing_matches_the_twins_in_the_interpreter():
    run_in_interpreter("moe_route", INTERPRETER)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 64, 256])
def test_cuda_routing_matches_the_twins(T):
    g = torch.Generator().manual_seed(T)
    logits = torch.randn(T, 256, generator=g).cuda()
    w, i = router_topk(logits, 8, renormalize=True)
    rw, ri = router_topk_torch(logits.cpu(), 8, renormalize=True)
    assert torch.equal(i.cpu(), ri) and (w.cpu() - rw).abs().max() < 1e-6
    ids, be = align(i, 256, 16)
    rids, rbe = align_torch(i.cpu(), 256, 16)
    assert torch.equal(ids.cpu(), rids) and torch.equal(be.cpu(), rbe)
