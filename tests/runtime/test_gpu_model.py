"""GPU (H200, never in CI): the fla/Triton path of the whole model vs the CPU torch reference."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.forward import decode_step, prefill
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec

from .conftest import make_model, rand_tokens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _pair(arch: str):
    cpu, _, _ = make_model(arch)
    gpu, _, _ = make_model(arch)
    gpu = gpu.to("cuda")
    gpu.set_backend("fla")
    cpu.set_backend("torch")
    return cpu, gpu


@pytest.mark.parametrize("arch", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_fla_prefill_and_decode_match_cpu_reference(arch):
    cpu, gpu = _pair(arch)
    seqs = [rand_tokens(n, 40 + n) for n in (70, 129, 5)]
    ref = prefill(cpu, seqs, all_logits=True)
    got = prefill(gpu, seqs, all_logits=True)
    for r, g in zip(ref, got):
        assert (r.all_logits - g.all_logits.cpu()).abs().max().item() < 2e-2  # fla runs its dots in TF32
    decode_step(cpu, ref, [1, 2, 3])
    decode_step(gpu, got, [1, 2, 3])
    for r, g in zip(ref, got):
        assert (r.last_logits - g.last_logits.cpu()).abs().max().item() < 2e-2


def test_fla_hypic_combine_matches_cpu_reference():
    cpu, gpu = _pair("qwen3_5_text")
    segs = [tuple(rand_tokens(n, 7 + n)) for n in (60, 90, 33)]
    suffix = rand_tokens(6, 3)
    outs = []
    for model, dev in ((cpu, "cpu"), (gpu, "cuda")):
        entries = build_entries(model, segs, [8, 8, 8])
        lay = plan_layout(segs, entries, [8, 8, 8], suffix, torch.device(dev))
        outs.append(combine(model, lay, entries, mode_spec("hypic")).last_logits.cpu())
    assert (outs[0] - outs[1]).abs().max().item() < 2e-2
