"""Kernel choices: ``Settings.kernels`` (``HYPIC_KERNELS__*``) -> a frozen ``KernelConfig`` that the
engine hands down (model modules, combine and its graph keys, the cold-build routing)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pydantic import ValidationError

from hypic_agent.config import Settings
from hypic_agent.config_kernels import KernelSettings
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.build import build_entries
from hypic_agent.runtime.hypic.combine import combine
from hypic_agent.runtime.hypic.combine_inputs import combine_inputs
from hypic_agent.runtime.hypic.layout import plan_layout
from hypic_agent.runtime.hypic.modes import mode_spec
from hypic_agent.runtime.models.layers.mlp import Experts
from hypic_agent.runtime.models.layers.norms import GatedRMSNorm, RMSNorm
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.runtime.runner.combine_graphs import CombineGraphs
from hypic_agent.runtime.runner.graph_set import GraphSet
from hypic_agent.runtime.runner.stage_graphs import bucket_sizes

from .conftest import make_model, rand_tokens
from .test_engine import Plan, docs


def test_settings_defaults_are_the_kernel_defaults():
    """Every ``KernelConfig`` field is a setting, and unset settings give the config's own defaults
    (the default values themselves are not restated here)."""
    assert Settings().kernels.config() == KernelConfig() == DEFAULT_KERNELS
    assert list(KernelSettings.model_fields) == [f.name for f in dataclasses.fields(KernelConfig)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_KERNELS.precise_for_half = True  # type: ignore[misc]


def test_kernel_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("HYPIC_KERNELS__PRECISE_FOR_HALF", "true")
    monkeypatch.setenv("HYPIC_KERNELS__MOE_TRITON_BLOCK_M", "64")
    monkeypatch.setenv("HYPIC_KERNELS__GRAPH_BUCKET_STEP", "512")
    k = Settings().kernels.config()
    assert k == dataclasses.replace(
        DEFAULT_KERNELS, precise_for_half=True, moe_triton_block_m=64, graph_bucket_step=512
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"combine_scan": "token"},  # the token-loop scan lost its A/B and left: an unknown field now
        {"moe_triton_max_slots": -1},
        {"moe_triton_block_m": 48},  # not a power of two
        {"moe_triton_block_m": 8},
        {"norm_fla_min_rows": -1},
        {"graph_bucket_step": 0},
        {"max_fused_cold_tokens": -5},
        {"combine_scann": "wy"},  # a typo is an error, not ignored
    ],
)
def test_bad_kernel_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        Settings(kernels=bad)
    if not {"combine_scann", "combine_scan"} & set(bad):
        with pytest.raises(ValueError):
            KernelConfig(**bad)


def test_engine_hands_its_kernels_to_the_model():
    model, _, _ = make_model("qwen3_5_moe_text")
    settings = Settings(kernels=KernelSettings(moe_triton_max_slots=0, norm_fla_min_rows=7))
    eng = Engine(model, tiny_tokenizer(), "tiny-test", settings)
    assert eng.kernels == dataclasses.replace(DEFAULT_KERNELS, moe_triton_max_slots=0, norm_fla_min_rows=7)
    mods = [m for m in model.modules() if isinstance(m, Experts | RMSNorm | GatedRMSNorm)]
    assert any(isinstance(m, Experts) for m in mods) and any(isinstance(m, GatedRMSNorm) for m in mods)
    assert all(m.kernels is eng.kernels for m in mods)


def test_cold_builds_leave_the_combine_above_max_fused_cold_tokens():
    """Up to ``max_fused_cold_tokens`` cold tokens are built inside the combine forward (its timings
    carry the cold batch's set-up), above it by the scatter pass; the logits agree."""
    model, _, _ = make_model("qwen3_5_text")
    d = docs(3, seed=700)
    out = {}
    for limit in (65536, 40):  # 48 cold tokens
        settings = Settings(min_cached_tokens=4, kernels=KernelSettings(max_fused_cold_tokens=limit))
        eng = Engine(model, tiny_tokenizer(), "tiny-test", settings)
        eng.prepare(Plan([d[0]]), mode="hypic")  # one warm entry, two cold
        prep = eng.prepare(Plan(d), mode="hypic")
        assert [u.hit for u in prep.segments] == [True, False, False]
        assert ("cold_tables_ms" in prep.timings_ms) == (limit > 48)
        out[limit] = prep.state.last_logits
    assert torch.allclose(out[65536], out[40], atol=1e-4)


@pytest.mark.parametrize("mode", ["transition", "addition"])
def test_leading_bodies_composed_first_or_in_the_scan(mode):
    """``precompose_leading_bodies`` off: a w = 0 prompt's leading bodies run inside each layer's scan
    (no ``lead``); either way the fused scan (torch twin here) matches the chunked path."""
    model, _, _ = make_model("qwen3_5_text")
    segs = [tuple(rand_tokens(n, 40 + n)) for n in (30, 17, 40)]
    seams = [0, 0, 0]
    entries = build_entries(model, segs, seams)
    lay = plan_layout(list(segs), list(entries), seams, rand_tokens(5, 2), torch.device("cpu"))
    spec = mode_spec(mode)
    ref = combine(model, lay, list(entries), spec, fused_scan=False)
    for pre in (True, False):
        kernels = KernelConfig(precompose_leading_bodies=pre)
        inputs = combine_inputs(model, lay, list(entries), spec.transition, True, kernels=kernels)
        assert (inputs.lead is not None) == pre and inputs.start == (3 if pre else 0) and inputs.kernels is kernels
        got = combine(model, lay, list(entries), spec, fused_scan=True, kernels=kernels)
        err = (got.last_logits - ref.last_logits).abs().max() / ref.last_logits.abs().max()
        assert err < 1e-4, (pre, err)


def test_combine_graphs_are_kept_per_kernel_choice():
    model, _, _ = make_model("qwen3_5_text")
    r = CombineGraphs(model)
    lay = plan_layout([(1, 2, 3)], [None], [0], [4], torch.device("cpu"))
    spec = mode_spec("hypic")
    keys = {r.key(lay, spec, None, k) for k in (DEFAULT_KERNELS, KernelConfig(), KernelConfig(precise_for_half=True))}
    assert len(keys) == 2


def test_the_runners_graphs_take_the_bucket_step_and_the_graph_settings():
    """``GraphSet.of`` (an engine's runner's graphs): the stage graphs' token buckets follow
    ``graph_bucket_step``, the combine graphs the ``combine_graph_*`` settings; none off CUDA (an
    engine on CPU) or with ``cuda_graphs`` off."""
    model, _, _ = make_model("qwen3_5_text")
    kernels = KernelConfig(graph_bucket_step=512)
    cuda = torch.device("cuda")  # GraphSet.of only constructs its parts: no device is touched
    gs = GraphSet.of(model, Settings(combine_graph_after=3, combine_graphs_max=2), kernels, cuda)
    assert gs.stages is not None and gs.stages.buckets == bucket_sizes(512)
    assert gs.combines is not None and (gs.combines.capture_after, gs.combines.max_graphs) == (3, 2)
    assert GraphSet.of(model, Settings(cuda_graphs=False), kernels, cuda) == GraphSet()
    eng = Engine(model, tiny_tokenizer(), "tiny-test", Settings())
    assert eng.runner.graphs == GraphSet()


@pytest.mark.parametrize("fused", [True, False])
def test_a_captured_decode_step_takes_the_fused_norms_and_gives_the_choice_back(fused):
    """Inside ``graph_kernels`` (warm-up and capture of a decode graph) every norm reads
    ``norm_fla_min_rows = 0`` when ``graph_norms_fused``; afterwards the model's own choice is back."""
    from hypic_agent.runtime.runner.decode_graphs import graph_kernels

    model, _, _ = make_model("qwen3_5_moe_text")
    own = KernelConfig(norm_fla_min_rows=300, graph_norms_fused=fused, moe_triton_max_slots=64)
    model.set_kernels(own)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm | GatedRMSNorm)]
    with graph_kernels(model):
        assert {m.kernels.norm_fla_min_rows for m in norms} == {0 if fused else 300}
        experts = {m.kernels.moe_triton_max_slots for m in model.modules() if isinstance(m, Experts)}
        assert experts == {own.moe_triton_max_slots}  # only the norms' choice is switched
    assert model.kernels is own and all(m.kernels is own for m in norms)
