"""GPU (H200, never in CI): LFM2, Granite 4, Nemotron-H, MiniMax, Kimi Linear, Ring-linear, Ling 3 and Falcon-H1 on
CUDA (``backend="fla"``: fla-core's ``chunk_kda`` / ``chunk_simple_gla`` for the linear layers' prefill and
pairs, fla's pool-indexed KDA step and the Triton conv kernels in decode) vs the CPU torch reference:
prefill, runner decode (decode graphs: the positions of a RoPE'd linear layer come from the captured
plan) and HYPIC combine.

Every token is routed to every expert (``_all_experts``): fla's TF32 dots move the linear layers'
outputs by ~1e-3, enough to flip a near-tie top-k choice of a random tiny router, which would move a
whole row of logits past any tolerance (``test_gpu_model._rows_close``); with all experts the MoE is a
continuous function of its input and a max-abs bound holds."""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.models.testing.tiny import tiny_config
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.runner.standalone import prefill

from .conftest import make_model, rand_tokens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
ARCHS = [
    "lfm2", "granitemoehybrid", "nemotron_h", "minimax", "kimi_linear", "bailing_moe_linear", "bailing_hybrid",
    "falcon_h1",
]  # fmt: skip


def _all_experts(arch: str) -> dict[str, int]:
    """Config overrides that route every token to every expert (and every expert group)."""
    cfg = tiny_config(arch)
    n = cfg.get("num_local_experts") or cfg.get("num_experts")
    if not n:
        return {}
    return {"num_experts_per_tok": n, **({"topk_group": cfg["n_group"]} if cfg.get("n_group") else {})}


def _pair(arch: str):
    cpu, _, _ = make_model(arch, **_all_experts(arch))
    gpu, _, _ = make_model(arch, **_all_experts(arch))
    gpu = gpu.to("cuda")
    gpu.set_backend("fla")
    cpu.set_backend("torch")
    return cpu, gpu


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_combine_match_cpu(arch):
    cpu, gpu = _pair(arch)
    segs = [tuple(rand_tokens(n, i)) for i, n in enumerate((40, 70, 33))]
    suffix = rand_tokens(7, 9)
    ref = prefill(cpu, [[t for s in segs for t in s] + suffix], all_logits=True)[0]
    got = prefill(gpu, [[t for s in segs for t in s] + suffix], all_logits=True)[0]
    assert (ref.all_logits - got.all_logits.cpu()).abs().max().item() < 2e-2
    spec, seams = mode_spec("hypic"), [8, 8, 8]
    outs = []
    for model in (cpu, gpu):
        dev = next(model.parameters()).device
        entries = build_entries(model, segs, seams)
        outs.append(combine(model, plan_layout(segs, entries, seams, suffix, dev), entries, spec))
    assert (outs[0].last_logits - outs[1].last_logits.cpu()).abs().max().item() < 2e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_runner_decode_matches_cpu(arch):
    """Prefill then 4 decode steps of 3 sequences through the runner (Triton conv decode against the
    pool's slots; KDA's fla step in place on the slots, the decay kinds' torch step on the gathered
    slot states) on both devices."""
    logits = []
    for model in _pair(arch):
        dev = next(model.parameters()).device
        pool = StatePool(model.config, slots=4, kv_tokens=512, page_size=16, device=dev, dtype=torch.float32)
        runner = ModelRunner(model, pool, decode_graphs=dev.type == "cuda")
        seqs = [pool.alloc(128) for _ in range(3)]
        prompts = [rand_tokens(n, 20 + n) for n in (9, 30, 17)]
        steps = [runner.forward(runner.plan(seqs, prompts)).cpu()]
        for i in range(4):
            steps.append(runner.forward(runner.plan(seqs, [[5 + i]] * 3)).cpu())
        logits.append(torch.stack(steps))
    assert (logits[0] - logits[1]).abs().max().item() < 2e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_combine_graph_replays_match_eager(arch):
    """The families' combine forwards are captured as CUDA graphs (their short scans take fla's fused
    recurrent kernels, the bodies' pairs are staged, conv tails and K/V by pointer) and replays give
    the eager logits and states: requests of one layout in other orders with other questions (bf16,
    as served)."""
    from hypic_agent.runtime.hypic.build import build_entries
    from hypic_agent.runtime.hypic.combine import combine
    from hypic_agent.runtime.hypic.layout import plan_layout
    from hypic_agent.runtime.hypic.modes import mode_spec
    from hypic_agent.runtime.runner.combine_graphs import CombineGraphs
    from hypic_agent.runtime.runner.graph_set import GraphSet
    from hypic_agent.runtime.runner.stage_graphs import LayerGraphs
    from hypic_agent.runtime.state import AttentionLayerState

    model = make_model(arch, **_all_experts(arch))[0].to("cuda", torch.bfloat16)
    model.set_backend("fla")  # the default kernels: short scans on fla's recurrent kernels
    pool = [tuple(rand_tokens(40, 500 + i)) for i in range(5)]
    entries = build_entries(model, pool, [8] * len(pool))
    requests = []
    for j, order in enumerate([[0, 1, 2], [3, 1, 4], [4, 0, 2], [2, 3, 1]]):
        es = [entries[i] for i in order]
        lay = plan_layout([pool[i] for i in order], es, [8] * 3, rand_tokens(7, 70 + j), torch.device("cuda"))
        requests.append((lay, es))
    spec = mode_spec("hypic")
    eager = [combine(model, lay, es, spec) for lay, es in requests]
    runner = CombineGraphs(model, capture_after=1)
    graphs = GraphSet(stages=LayerGraphs(model), combines=runner)
    got = [combine(model, lay, es, spec, graphs=graphs) for lay, es in requests]
    assert runner.disabled is None, runner.disabled
    assert runner.replays == len(requests) - 1  # captured on the first, replayed after
    a0, a1 = (next(st.v for st in e.layers if isinstance(st, AttentionLayerState)).float() for e in eager[:2])
    assert (a0 - a1).abs().max().item() > 5e-2 * a0.abs().max().item()  # a stale replay would show
    for ref, out in zip(eager, got, strict=True):
        scale = ref.last_logits.abs().max().item()
        assert (ref.last_logits - out.last_logits).abs().max().item() < 3e-2 * scale
        for a, b in zip(ref.layers, out.layers, strict=True):
            for ta, tb in zip(vars(a).values(), vars(b).values(), strict=True):
                if not ta.numel():  # a state part the kind does not have (LFM2's recurrent, Lightning's conv)
                    continue
                assert (ta.float() - tb.float()).abs().max().item() < 5e-2 * max(ta.float().abs().max().item(), 1e-6)
