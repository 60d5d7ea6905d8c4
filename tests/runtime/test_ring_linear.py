"""Ring-linear (``bailing_moe_linear``): Lightning attention with RoPE inside the linear layer.

transformers has no Ring-linear model, so the layer is checked against a token-by-token reference
written here from the published math (vLLM's ``BailingMoELinearAttention``), and the model against
itself across prefill / chunked prefill / decode. HYPIC: a cached state built at local positions is
re-rotated to its segment's offset (``R(P) S``); with it composition is exact where the layer inputs
are, without it it is not.
"""

from __future__ import annotations

import pytest
import torch

from hypic_agent.runtime.hypic.entry import LinearEntry
from hypic_agent.runtime.runner.standalone import decode_step, prefill

from .conftest import make_model, rand_tokens
from .test_family_pairs import compose, one_pass, rel, segments

ARCH = "bailing_moe_linear"


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _neox(x: torch.Tensor, pos: int, rd: int, theta: float) -> torch.Tensor:
    """x ``[H, D]`` rotated at ``pos`` (rotate-half on the first ``rd`` dims)."""
    inv = 1.0 / theta ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    ang = pos * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()]).float(), torch.cat([ang.sin(), ang.sin()]).float()
    r, rest = x[:, :rd], x[:, rd:]
    half = torch.cat([-r[:, rd // 2 :], r[:, : rd // 2]], dim=-1)
    return torch.cat([r * cos + half * sin, rest], dim=-1)


def reference_layer(mixer, x: torch.Tensor, start: int) -> torch.Tensor:
    """Ring-linear's linear attention token by token from a zero state, tokens at ``start + t``."""
    h, d, eps = mixer.hv, mixer.dk, mixer.g_norm.eps
    S = torch.zeros(h, d, d)
    slopes = torch.tensor(mixer.slopes)
    outs = []
    for t in range(x.shape[0]):
        q, k, v = (x[t] @ mixer.query_key_value.weight.T).view(3, h, d)
        q, k = _rms(q, mixer.query_layernorm.weight, eps), _rms(k, mixer.key_layernorm.weight, eps)
        q = _neox(q, start + t, mixer.rotary_dim, mixer.theta) * d**-0.5
        k = _neox(k, start + t, mixer.rotary_dim, mixer.theta)
        S = torch.exp(-slopes)[:, None, None] * S + k[:, :, None] * v[:, None, :]
        o = torch.einsum("hk,hkv->hv", q, S).reshape(mixer.groups, -1)
        y = _rms(o, 1.0, eps).reshape(-1) * mixer.g_norm.weight
        outs.append(mixer.dense(torch.sigmoid(mixer.g_proj(x[t])) * y))
    return torch.stack(outs)


@pytest.fixture(scope="module")
def ring():
    return make_model(ARCH)[0]


@pytest.mark.parametrize("start", [0, 37])
def test_linear_layer_matches_the_token_by_token_reference(ring, start):
    mixer = ring.layers[1].linear_attn
    x = torch.randn(23, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        qkv, gate = mixer.inputs(x)
        pos = torch.arange(start, start + 23)
        ops, _ = mixer.convolve(qkv, gate, None, None, positions=pos)
        o, _ = mixer.mix(ops, None, None)
        ours = mixer.output(o, gate)
        ref = reference_layer(mixer, x, start)
    assert (ours - ref).abs().max().item() <= 1e-5
    assert (
        mixer.slopes[0] > mixer.slopes[-1] > 0 and ring.layers[3].linear_attn.slopes[0] < 1e-4
    )  # last layer ~ no decay


def test_prefill_chunked_prefill_and_decode_agree(ring):
    toks = rand_tokens(40, 1)
    full = prefill(ring, [toks], all_logits=True)[0]
    first = prefill(ring, [toks[:25]])[0]
    (second,) = prefill(ring, [toks[25:39]], [first])
    assert (second.last_logits - full.all_logits[38]).abs().max().item() <= 1e-5
    decode_step(ring, [second], [toks[39]])
    assert (second.last_logits - full.last_logits).abs().max().item() <= 1e-5
    for a, b in zip(second.layers, full.layers, strict=True):
        if hasattr(a, "recurrent"):
            assert rel(a.recurrent, b.recurrent) <= 1e-5


@pytest.mark.parametrize("offset", [1, 33, 500])
def test_place_rotates_a_local_state_to_its_global_offset_exactly(ring, offset):
    """S built at local positions 0..n-1, placed at P, equals the same tokens run at P..P+n-1."""
    mixer = ring.layers[0].linear_attn
    x = torch.randn(30, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        qkv, gate = mixer.inputs(x)
        states = []
        for p0 in (0, offset):
            ops, _ = mixer.convolve(qkv, gate, None, None, positions=torch.arange(p0, p0 + 30))
            states.append(mixer.mix(ops, None, None)[1][0])
    local, glob = states
    assert rel(mixer.place(local, offset), glob) <= 1e-5
    assert rel(local, glob) > 1e-2  # unrotated, the state is not the one at P


def test_entry_is_a_per_head_decay_and_a_local_state(ring):
    seg = tuple(rand_tokens(40, 3))
    from hypic_agent.runtime.hypic.build import build_entries

    (entry,) = build_entries(ring, [seg], [5])
    le = entry.layers[0]
    assert isinstance(le, LinearEntry) and le.T.shape == (4,) and le.S.shape == (4, 16, 16)
    s = torch.tensor(ring.layers[0].linear_attn.slopes)
    assert torch.allclose(le.T, torch.exp(-s * 35), rtol=1e-5)  # body = tokens 5..39


def _linear_only():
    return make_model(ARCH, layer_group_size=0)[0]  # every layer Lightning-with-RoPE


@pytest.mark.parametrize(("mode", "w"), [("transition_rope", 0), ("hypic", 3)])
def test_composed_state_equals_one_pass_at_layer0_only_with_rerotation(mode, w):
    """Layer 0's inputs are token-local, so its composed state is exact: T_C S(prefix) + R(P) S(C|0).
    ``transition`` (the same without re-rotation) is far off."""
    model = _linear_only()
    segs, suffix = segments(), rand_tokens(5, 98)
    ref = one_pass(model, segs, suffix).layers[0].recurrent
    st, _ = compose(model, segs, suffix, mode, w)
    assert rel(st.layers[0].recurrent, ref) <= 1e-5
    skipped, _ = compose(model, segs, suffix, "transition", 0)
    assert rel(skipped.layers[0].recurrent, ref) > 0.05


def test_seams_covering_whole_segments_equal_full_recompute_in_every_layer(ring):
    segs, suffix = segments(seed=7), rand_tokens(6, 95)
    full = one_pass(ring, segs, suffix)
    st, _ = compose(ring, segs, suffix, "hypic", 1.0)
    assert (st.last_logits - full.last_logits).abs().max().item() <= 1e-5
    for li in ring.config.linear_layers:
        assert rel(st.layers[li].recurrent, full.layers[li].recurrent) <= 1e-5


def _hub_names(cfg, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors under Ring-linear's hub names (fused attention qkv, per-expert MLPs)."""
    out: dict[str, torch.Tensor] = {}
    attn = {"q_norm": "query_layernorm", "k_norm": "key_layernorm", "o_proj": "dense"}
    for k, v in sd.items():
        k = k.replace("model.embed_tokens.", "model.word_embeddings.").replace(".linear_attn.", ".attention.")
        k = k.replace(".e_score_correction_bias", ".expert_bias").replace(".shared_expert.", ".shared_experts.")
        if ".experts.gate_up_proj" in k:
            for e, w in enumerate(v):
                gate, up = w.chunk(2)
                out[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                out[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
            continue
        if ".experts.down_proj" in k:
            for e, w in enumerate(v):
                out[k.replace("down_proj", f"{e}.down_proj.weight")] = w
            continue
        if ".self_attn." in k:
            leaf = k.split(".self_attn.")[1].split(".")[0]
            if leaf in ("k_proj", "v_proj"):
                continue
            if leaf == "q_proj":
                parts = [sd[k.replace("q_proj", n)] for n in ("q_proj", "k_proj", "v_proj")]
                out[k.replace("self_attn.q_proj", "attention.query_key_value")] = torch.cat(parts)
                continue
            k = k.replace(f"self_attn.{leaf}", f"attention.{attn[leaf]}")
        out[k] = v
    return out


def test_hf_folder_with_hub_names_loads_to_the_same_model(ring, tmp_path):
    import json

    from safetensors.torch import save_file

    from hypic_agent.runtime.models.hybrid import build_model
    from hypic_agent.runtime.models.loading.weights import load_checkpoint
    from hypic_agent.runtime.models.testing.tiny import tiny_config

    model, sd, raw = make_model(ARCH)
    hub = _hub_names(model.config, sd)
    assert (
        "model.layers.2.attention.query_key_value.weight" in hub
        and "model.layers.1.mlp.experts.3.up_proj.weight" in hub
    )
    save_file({k: v.contiguous() for k, v in hub.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(
        json.dumps({**tiny_config(ARCH), "architectures": ["BailingMoeLinearV2ForCausalLM"]})
    )
    cfg, _, tensors = load_checkpoint(tmp_path)
    assert cfg.linear_kind == "lightning_rope" and cfg.linear_group_norm == 2 and cfg.rotary_dim == 8
    loaded = build_model(raw)
    loaded.load_weights(tensors)
    toks = rand_tokens(20, 4)
    assert torch.equal(prefill(loaded, [toks])[0].last_logits, prefill(model, [toks])[0].last_logits)


def test_ring_config_refusals():
    from hypic_agent.errors import ModelConfigError
    from hypic_agent.runtime.models.families import normalize_config
    from hypic_agent.runtime.models.testing.tiny import tiny_config

    with pytest.raises(ModelConfigError, match="MLA"):
        normalize_config({**tiny_config(ARCH), "kv_lora_rank": 512})
    with pytest.raises(ModelConfigError, match="softmax router"):
        normalize_config({**tiny_config(ARCH), "score_function": "softmax", "moe_router_enable_expert_bias": False})
