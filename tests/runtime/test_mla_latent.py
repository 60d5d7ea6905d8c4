"""MLA layers (Kimi Linear, Ling 3) cache the latent form: an entry's, a request state's and the pool's
rows are the shared rope key ``[1, rope]`` and the normed latent ``[1, kv_lora_rank]``; only the rope
part is (re-)rotated, and per-head K / V exist only inside attention (``MLAttention.expand``, or the
absorbed ``paged_decode``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.entry import AttentionEntry, SegmentEntry
from hypic_agent.runtime.models.families import normalize_config
from hypic_agent.runtime.models.layers.mla import MLAttention
from hypic_agent.runtime.models.testing.tiny import build_hf_model
from hypic_agent.runtime.runner.plan import plan_forward
from hypic_agent.runtime.runner.pool import StatePool
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.runner.sizing import bytes_per_token
from hypic_agent.runtime.runner.standalone import prefill

from .conftest import make_model, rand_tokens
from .test_family_pairs import compose, one_pass, segments

ARCHS = ["kimi_linear", "bailing_hybrid"]
MLA_FIRST = ["full_attention", "linear_attention", "linear_attention", "linear_attention"]
KIMI_48B = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "kimi_linear_48b_a3b.json"


def _mla(model) -> MLAttention:
    attn = next(layer.self_attn for layer in model.layers if layer.self_attn is not None)
    assert isinstance(attn, MLAttention)
    return attn


@pytest.mark.parametrize("arch", ARCHS)
def test_entry_mla_layers_hold_the_rope_key_and_the_latent(arch):
    model, _, _ = make_model(arch)
    mla = model.config.mla
    assert mla is not None
    n = 27
    (e,) = build_entries(model, [tuple(rand_tokens(n, 5))], [4])
    att = [x for x in e.layers if isinstance(x, AttentionEntry)]
    assert att and len(att) == len(model.config.attention_layers)
    for x in att:
        assert x.k.shape == (n, 1, mla.qk_rope_head_dim) and x.v.shape == (n, 1, mla.kv_lora_rank)
    per_token = (mla.qk_rope_head_dim + mla.kv_lora_rank) * 4  # fp32
    expanded = 2 * model.config.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) * 4
    assert e.bytes_per_layer()["attention"] == n * per_token < n * expanded // 4
    # the latent is the layer's normed kv_a output, as kv_b_proj reads it
    attn = _mla(model)
    li = model.config.attention_layers[0]
    st = prefill(model, [list(e.token_ids)])[0]
    torch.testing.assert_close(st.layers[li].v, e.layers[li].v, rtol=1e-5, atol=1e-5)  # type: ignore[union-attr]
    assert attn.kv_b_proj.in_features == mla.kv_lora_rank
    back = SegmentEntry.from_tensors(e.to_tensors(), model.config.layer_types)
    assert back.nbytes() == e.nbytes() and torch.equal(back.layers[li].v, e.layers[li].v)  # type: ignore[union-attr]


def _interleaved_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """DeepSeek's RoPE as transformers applies it to the shared key ``[T, rope]``: de-interleave the
    pairs, then rotate-half at ``pos`` (written out here, independent of ``kernels.rope``)."""
    d = x.shape[-1]
    x = torch.cat([x[:, 0::2], x[:, 1::2]], dim=-1)
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    rot = torch.cat([-x[:, d // 2 :], x[:, : d // 2]], dim=-1)
    return x * cos + rot * sin


@pytest.mark.parametrize("offset", [0, 37])
def test_cached_rope_key_rerotated_to_an_offset_equals_the_key_computed_there(offset):
    """Ling 3 (RoPE'd MLA) as layer 0: an entry built at local positions, its rope key re-rotated to
    ``offset``, expands to the per-head keys the layer computes at ``offset`` (DeepSeek's formula)."""
    model, _, _ = make_model("bailing_hybrid", layer_types=MLA_FIRST)
    attn = _mla(model)
    seg = tuple(rand_tokens(23, 9))
    (e,) = build_entries(model, [seg], [0])
    ae = e.layers[0]
    assert isinstance(ae, AttentionEntry)
    pos = torch.arange(offset, offset + len(seg))
    keys, values = attn.expand(attn.rotate(ae.k, pos), ae.v)
    # the reference: the layer's inputs are token-local (layer 0), its key computed at ``pos`` directly
    with torch.no_grad():
        x = model.layers[0].input_layernorm(model.embed(torch.tensor(seg)))
        latent, k_pe = torch.split(attn.kv_a_proj_with_mqa(x), [attn.rank, attn.rope], dim=-1)
        kv = attn.kv_b_proj(attn.kv_a_layernorm(latent)).view(len(seg), attn.hq, -1)
        k_nope, v = kv[..., : attn.nope], kv[..., attn.nope :]
        k_rope = _interleaved_rope(k_pe, pos, attn.theta)[:, None, :].expand(-1, attn.hq, -1)
    assert (keys - torch.cat([k_rope, k_nope], dim=-1)).abs().max().item() <= 1e-5
    assert torch.equal(values[..., attn.v_dim :], torch.zeros_like(values[..., attn.v_dim :]))
    assert (values[..., : attn.v_dim] - v).abs().max().item() <= 1e-5
    # and the same rows of a one-pass prefill that puts the segment at ``offset``
    head = rand_tokens(offset, 4)
    st = prefill(model, [head + list(seg)])[0]
    assert (st.layers[0].k[offset:] - attn.rotate(ae.k, pos)).abs().max().item() <= 1e-5
    if offset:  # not rotating the rope part is wrong (the check above can fail)
        assert (st.layers[0].k[offset:] - ae.k).abs().max().item() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_hypic_with_whole_segment_seams_equals_full_recompute_from_latent_entries(arch):
    model, _, _ = make_model(arch)
    segs, suffix = segments(seed=11), rand_tokens(6, 93)
    full = one_pass(model, segs, suffix)
    st, entries = compose(model, segs, suffix, "hypic", 1.0)
    li = model.config.attention_layers[0]
    rank = model.config.mla.kv_lora_rank  # type: ignore[union-attr]
    assert all(e.layers[li].v.shape[-1] == rank for e in entries)  # type: ignore[union-attr]
    assert (st.last_logits - full.last_logits).abs().max().item() <= 1e-4
    for a, b in zip(st.layers[li].k, full.layers[li].k, strict=True):  # type: ignore[union-attr]
        assert (a - b).abs().max().item() <= 1e-4


def _runner(model):
    p = next(model.parameters())
    pool = StatePool(model.config, slots=3, kv_tokens=256, page_size=8, device=p.device, dtype=p.dtype)
    return pool, ModelRunner(model, pool)


@pytest.mark.parametrize("arch", ARCHS)
def test_runner_decode_over_latent_pages_equals_transformers_expanded_kv(arch):
    """Two sequences decoded together through the pool: paged (the absorbed path over the block table)
    and over gathered rows (expanded per forward), both against transformers' cached decode, which
    keeps per-head K / V."""
    model, sd, cfg = make_model(arch)
    hf = build_hf_model(cfg, sd)
    prompts = [rand_tokens(13, 21), rand_tokens(20, 22)]
    steps = 5
    ref = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            out = hf.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=steps, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=256,
            )  # fmt: skip
            ref.append(([int(t) for t in out.sequences[0, len(ids) :]], [lg[0] for lg in out.logits]))
    mla = model.config.mla
    assert mla is not None
    for paged in (True, False):
        pool, runner = _runner(model)
        assert pool.k.shape[-2:] == (1, mla.qk_rope_head_dim) and pool.v.shape[-2:] == (1, mla.kv_lora_rank)
        seqs = [pool.alloc(40) for _ in prompts]
        logits = runner.forward(plan_forward(pool, seqs, prompts))
        for t in range(steps):
            for i in range(len(prompts)):
                assert (logits[i] - ref[i][1][t]).abs().max().item() <= 1e-4, (paged, t, i)
            plan = plan_forward(pool, seqs, [[ref[i][0][t]] for i in range(len(prompts))], paged=paged)
            assert (plan.key_rows.numel() == 0) == paged
            logits = runner.forward(plan)


def test_absorbed_paged_decode_equals_expanded_attention_and_zeroes_empty_rows():
    model, _, _ = make_model("bailing_hybrid")
    attn = _mla(model)
    g = torch.Generator().manual_seed(3)
    page, n_pages = 4, 9
    k_pages = torch.randn(n_pages, page, 1, attn.rope, generator=g)
    v_pages = torch.randn(n_pages, page, 1, attn.rank, generator=g)
    table = torch.tensor([[3, 1, 7], [2, 0, 0], [0, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([10, 3, 0], dtype=torch.int32)
    q = torch.randn(3, attn.hq, attn.d, generator=g)
    with torch.no_grad():
        got = attn.paged_decode(q, k_pages, v_pages, table, lens)
        for i, n in enumerate(lens.tolist()):
            if not n:
                assert torch.equal(got[i], torch.zeros_like(got[i]))
                continue
            k = k_pages[table[i].long()].reshape(-1, 1, attn.rope)[:n]
            v = v_pages[table[i].long()].reshape(-1, 1, attn.rank)[:n]
            cu_q, cu_k = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32)
            want = attn.attend(q[i : i + 1], k, v, cu_q, cu_k)
            assert (got[i] - want[0]).abs().max().item() <= 1e-5


def test_kimi_48b_pool_and_entry_bytes_per_token_are_the_latent_form():
    cfg = normalize_config(json.loads(KIMI_48B.read_text()))
    mla = cfg.mla
    assert mla is not None and (mla.kv_lora_rank, mla.qk_rope_head_dim) == (512, 64)
    n_att = len(cfg.attention_layers)
    assert n_att == 7 and cfg.attention_cache_rows == ((1, 64), (1, 512))
    assert bytes_per_token(cfg, torch.bfloat16) == n_att * 1152  # 1.125 KiB per token and MLA layer
    expanded = 2 * cfg.num_attention_heads * cfg.head_dim * 2  # K and zero-padded V per head, bf16
    assert expanded == 24576 and math.isclose(expanded / 1152, 21.33, rel_tol=1e-3)


def test_fingerprint_names_the_latent_entry_layout(monkeypatch):
    from hypic_agent.runtime.models.loading import fingerprint as fp
    from hypic_agent.runtime.models.testing.tiny import tiny_config

    kimi, qwen = (normalize_config(tiny_config(a)) for a in ("kimi_linear", "qwen3_5_text"))
    assert fp.entry_layout(kimi) == "mla-latent-v1" and fp.entry_layout(qwen) == ""
    latent, base = fp.model_fingerprint(kimi, seed=0), fp.model_fingerprint(qwen, seed=0)
    monkeypatch.setattr(fp, "entry_layout", lambda cfg: "")  # the expanded layout's key: no tag
    assert fp.model_fingerprint(kimi, seed=0) != latent
    assert fp.model_fingerprint(qwen, seed=0) == base  # other families' keys unchanged


SPLICE = """
# the splice tables by pointer (the CUDA path) over MLA entries, whose key and value rows differ in width
from unittest import mock
import torch
from hypic_agent.kernels import gather_spans
from hypic_agent.runtime.hypic import splice
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.layout import plan_layout
from tests.runtime.conftest import make_model, rand_tokens
model, _, _ = make_model("kimi_linear")
segs = [tuple(rand_tokens(n, 40 + n)) for n in (19, 11, 26)]
seams = [5, 0, 7]
entries = build_entries(model, segs, seams)
lay = plan_layout(list(segs), list(entries), seams, rand_tokens(4, 1), torch.device("cpu"))
with mock.patch.object(splice, "resolve_triton", lambda b, d: True), \\
        mock.patch.object(gather_spans, "resolve_triton", lambda b, d: True):
    tables = splice.build(model, lay, list(entries), torch.device("cpu"))
    assert tables is not None and tables.k_row == (1, 8) and tables.v_row[0] == 1, tables
    for li in model.config.attention_layers:
        v_full = torch.full((lay.total, *tables.v_row), float("nan"))
        keys = tables.bodies(li, v_full)
        want_k = torch.cat([e.layers[li].k[s:] for e, s in zip(entries, seams)])
        assert torch.equal(keys, want_k), li
        assert torch.equal(v_full[lay.body_pos], torch.cat([e.layers[li].v[s:] for e, s in zip(entries, seams)]))
"""


def test_splice_tables_carry_latent_rows_by_pointer():
    from tests.kernels.helpers import run_in_interpreter

    run_in_interpreter("mla splice", SPLICE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_graph_decode_over_latent_pages_equals_expanded_eager(arch):
    """CUDA: decode replayed from graphs (the absorbed ``paged_decode`` over the block table, padding
    rows of no context) equals eager decode over gathered rows (the latent expanded per forward)."""
    import contextlib

    from hypic_agent.runtime.runner.decode_graphs import graph_kernels

    from .test_gpu_families import _all_experts

    # bf16, as served: fp32 experts run a host loop over expert counts, which a graph cannot capture
    model = make_model(arch, **_all_experts(arch))[0].to("cuda", torch.bfloat16)
    prompts = [rand_tokens(n, 40 + n) for n in (9, 70, 33)]  # batch 3: bucket 4, one padding row
    runs = {}
    for graphs in (True, False):
        pool = StatePool(
            model.config, slots=4, kv_tokens=1024, page_size=16, device=torch.device("cuda"), dtype=torch.bfloat16
        )
        runner = ModelRunner(model, pool, decode_graphs=graphs, max_batch=8)
        seqs = [pool.alloc(120) for _ in prompts]
        out = [runner.forward(plan_forward(pool, seqs, prompts)).clone()]
        for step in range(5):
            toks = [[int(t)] for t in rand_tokens(3, 900 + step)]
            with contextlib.nullcontext() if graphs else graph_kernels(model):
                out.append(runner.forward(plan_forward(pool, seqs, toks)).clone())
        if graphs:
            assert runner.decode_graphs is not None and runner.decode_graphs.replays == 5, runner.decode_graphs
        runs[graphs] = out
    for a, b in zip(runs[True], runs[False], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)
