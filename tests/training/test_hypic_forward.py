"""The segment-isolated training forward computes exactly what the runtime's ``hypic`` mode serves."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.training.hypic_forward import SegmentPlan, hypic_run, plan_for
from tests.runtime.conftest import make_model

CPU = torch.device("cpu")


def served_logits(model, row: list[int], plan: SegmentPlan) -> torch.Tensor:
    """Last-token logits of the runtime's ``hypic`` mode for one row cut as ``plan`` says."""
    n, ls = plan.n_segments, plan.segment_len
    segs = [tuple(row[s * ls : (s + 1) * ls]) for s in range(n)]
    seams = [plan.seam] * n
    entries = build_entries(model, segs, seams)
    layout = plan_layout(segs, entries, seams, row[plan.segmented :], CPU)
    return combine(model, layout, entries, mode_spec("hypic")).last_logits


@pytest.mark.parametrize("arch", ["qwen3_5_text", "qwen3_next", "llama"])
@pytest.mark.parametrize("seam", [0, 2, 5])
def test_matches_the_runtime_hypic_mode(arch, seam):
    model, _, _ = make_model(arch)
    plan = SegmentPlan(n_segments=3, segment_len=12, seam=seam, suffix_len=5)
    ids = torch.randint(0, 256, (2, plan.total), generator=torch.Generator().manual_seed(seam))
    with torch.no_grad():
        out = hypic_run(model, ids, plan)
    assert out.final.shape[:2] == (2, 3 * seam + 5)
    assert out.active.tolist() == plan.active_positions()
    for b in range(2):
        ref = served_logits(model, ids[b].tolist(), plan)
        got = model.logits(out.final[b, -1:])[0]
        assert (got - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


def test_differs_from_one_pass_and_trains():
    from hypic_agent.training.forward import run_model

    model, _, _ = make_model("qwen3_5_text")
    plan = plan_for(40, segment_len=10, seam=2, min_suffix=6)
    assert (plan.n_segments, plan.suffix_len) == (3, 10)
    ids = torch.randint(0, 256, (2, plan.total), generator=torch.Generator().manual_seed(1))
    full = run_model(model, ids).final[:, plan.active_positions()]
    out = hypic_run(model, ids, plan, grad_checkpoint=True)
    assert (out.final - full).abs().max().item() > 1e-3  # isolated bodies change the active tokens
    out.final.float().pow(2).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if ".linear_attn." in n or ".self_attn." in n]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)  # type: ignore[union-attr]


def test_bad_plans():
    with pytest.raises(ValueError, match="seam"):
        SegmentPlan(2, 8, 8, 4)
    with pytest.raises(ValueError, match="no segment"):
        plan_for(16, segment_len=16, seam=2, min_suffix=4)
    model, _, _ = make_model("llama")
    with pytest.raises(ValueError, match="tokens per row"):
        hypic_run(model, torch.zeros(1, 30, dtype=torch.long), SegmentPlan(2, 8, 2, 4))
