"""Checkpoint names of the families whose transformers modules are named differently from ours.

Our modules keep one naming for every family (``model.layers.{i}.linear_attn`` for any linear
mixer, ``self_attn.{q,k,v,o}_proj`` / ``q_norm`` / ``k_norm``, ``input_layernorm`` /
``post_attention_layernorm``, ``mlp.{gate,up,down}_proj`` or ``mlp.{gate,experts,shared_expert}``,
``model.norm``). ``to_contract`` renames (and where a tensor is fused, splits) transformers' names
of ``lfm2``, ``granitemoehybrid``, ``nemotron_h`` (whose blocks are regrouped into layers,
``HybridConfig.hf_blocks``), ``minimax``, ``kimi_linear``, Ring-linear's ``bailing_moe_linear`` (hub
names) and ``falcon_h1`` (each checkpoint layer split into two of ours) into it; names already in our
naming pass through, so it is safe to apply twice. Other families are
returned as they are.
"""

from __future__ import annotations

import re

import torch

from hypic_agent.runtime.models.config import HybridConfig

_LAYER = r"^(model\.layers\.\d+\.)"

_LFM2: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^model\.embedding_norm\."), "model.norm."),
    (re.compile(_LAYER + r"conv\."), r"\1linear_attn."),
    (re.compile(_LAYER + r"self_attn\.out_proj\."), r"\1self_attn.o_proj."),
    (re.compile(_LAYER + r"self_attn\.q_layernorm\."), r"\1self_attn.q_norm."),
    (re.compile(_LAYER + r"self_attn\.k_layernorm\."), r"\1self_attn.k_norm."),
    (re.compile(_LAYER + r"operator_norm\."), r"\1input_layernorm."),
    (re.compile(_LAYER + r"ffn_norm\."), r"\1post_attention_layernorm."),
    (re.compile(_LAYER + r"feed_forward\.w1\."), r"\1mlp.gate_proj."),
    (re.compile(_LAYER + r"feed_forward\.w3\."), r"\1mlp.up_proj."),
    (re.compile(_LAYER + r"feed_forward\.w2\."), r"\1mlp.down_proj."),
]

_GRANITE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(_LAYER + r"mamba\."), r"\1linear_attn."),
    (re.compile(_LAYER + r"block_sparse_moe\.router\.(layer\.)?weight$"), r"\1mlp.gate.weight"),
    (re.compile(_LAYER + r"block_sparse_moe\.experts\."), r"\1mlp.experts."),
    # the older GraniteMoe layout of the same expert tensors ([E, 2I, D] / [E, D, I])
    (re.compile(_LAYER + r"block_sparse_moe\.input_linear\.weight$"), r"\1mlp.experts.gate_up_proj"),
    (re.compile(_LAYER + r"block_sparse_moe\.output_linear\.weight$"), r"\1mlp.experts.down_proj"),
]
_SHARED = re.compile(_LAYER + r"shared_mlp\.(input|output)_linear\.weight$")


def _rename(name: str, rules: list[tuple[re.Pattern[str], str]]) -> str:
    for pat, rep in rules:
        name, n = pat.subn(rep, name)
        if n:
            return name
    return name


_NEMOTRON_BLOCK = re.compile(r"^(?:model|backbone)\.layers\.(\d+)\.(norm|mixer)\.(.+)$")
_NEMOTRON_TOP = {
    "model.embeddings.weight": "model.embed_tokens.weight",
    "backbone.embeddings.weight": "model.embed_tokens.weight",
    "model.norm_f.weight": "model.norm.weight",
    "backbone.norm_f.weight": "model.norm.weight",
}


def _nemotron(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Block j's ``norm`` / ``mixer`` -> its layer's ``input_layernorm`` and ``linear_attn`` / ``self_attn``
    (a mixer block) or ``post_attention_layernorm`` and ``mlp`` (the MLP block after it)."""
    role: dict[int, tuple[int, str, str]] = {}
    for i, (mixer_block, ffn_block) in enumerate(cfg.hf_blocks):
        role[mixer_block] = (i, "input_layernorm", "linear_attn" if cfg.layer_types[i] == "linear" else "self_attn")
        if ffn_block >= 0:
            role[ffn_block] = (i, "post_attention_layernorm", "mlp")
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        m = _NEMOTRON_BLOCK.match(k)
        if m is None or int(m[1]) not in role:
            out[_NEMOTRON_TOP.get(k, k)] = v
            continue
        layer, norm, mixer = role[int(m[1])]
        out[f"model.layers.{layer}.{norm if m[2] == 'norm' else mixer}.{m[3]}"] = v
    return out


_MINIMAX_LAYER = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(.+)$")
_MINIMAX_BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")  # recomputed, not loaded


def _minimax(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Lightning layers' ``self_attn.*`` -> ``linear_attn.*``; their decay buffers dropped."""
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        m = _MINIMAX_LAYER.match(k)
        if m is not None and cfg.layer_types[int(m[1])] == "linear":
            if m[2] in _MINIMAX_BUFFERS:
                continue
            k = f"model.layers.{m[1]}.linear_attn.{m[2]}"
        out[k] = v
    return out


_MIXTRAL_EXPERT = re.compile(_LAYER + r"mlp\.experts\.(\d+)\.w([123])\.weight$")
_W = {"1": "gate", "2": "down", "3": "up"}


def expert_name(cfg: HybridConfig, name: str) -> str:
    """A checkpoint name before per-expert tensors are fused (``loading.map_checkpoint_names``): MiniMax
    and Kimi Linear hub checkpoints keep the MoE under ``block_sparse_moe`` with Mixtral-style experts
    (``experts.{e}.w1/w2/w3``), renamed here to ``mlp.experts.{e}.{gate,down,up}_proj`` (``mlp.gate``)."""
    if cfg.family not in ("minimax", "kimi_linear"):
        return name
    name = name.replace(".block_sparse_moe.", ".mlp.")
    m = _MIXTRAL_EXPERT.match(name)
    return name if m is None else f"{m[1]}mlp.experts.{m[2]}.{_W[m[3]]}_proj.weight"


_KIMI_GATE = re.compile(r"\.linear_attn\.(f_a_proj\.|f_b_proj\.|f_proj\.|dt_bias$|A_log$)")
_KIMI_CONV = re.compile(r"^(model\.layers\.\d+\.linear_attn\.)([qkv])_conv1d\.weight$")


def _kimi(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """KDA layers' ``self_attn.*`` -> ``linear_attn.*``; hub checkpoints' forget-gate tensors moved under
    ``forget_gate`` and their ``q/k/v_conv1d`` stacked into ``conv1d``; ``mlp.shared_experts`` ->
    ``mlp.shared_expert``."""
    out: dict[str, torch.Tensor] = {}
    convs: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        m = _MINIMAX_LAYER.match(k)
        if m is not None and cfg.layer_types[int(m[1])] == "linear":
            k = _KIMI_GATE.sub(r".linear_attn.forget_gate.\1", f"model.layers.{m[1]}.linear_attn.{m[2]}")
        c = _KIMI_CONV.match(k)
        if c is not None:
            convs.setdefault(c[1], {})[c[2]] = v
            continue
        out[k.replace(".mlp.shared_experts.", ".mlp.shared_expert.")] = v
    for pre, parts in convs.items():
        out[pre + "conv1d.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


_RING_LAYER = re.compile(r"^model\.layers\.(\d+)\.attention\.(.+)$")
_RING_ATTN = {"query_layernorm": "q_norm", "key_layernorm": "k_norm", "dense": "o_proj"}


def _ring(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Ring-linear (hub ``bailing_moe_linear``): ``word_embeddings`` -> ``embed_tokens``; a linear
    layer's ``attention.*`` -> ``linear_attn.*`` (same leaf names); an attention layer's fused
    ``query_key_value`` split into ``self_attn.{q,k,v}_proj``, its ``query/key_layernorm`` / ``dense`` ->
    ``q_norm`` / ``k_norm`` / ``o_proj``; ``mlp.gate.expert_bias`` -> ``e_score_correction_bias``,
    ``mlp.shared_experts`` -> ``mlp.shared_expert``."""
    out: dict[str, torch.Tensor] = {}
    q_rows = cfg.num_attention_heads * cfg.head_dim
    kv_rows = cfg.num_key_value_heads * cfg.head_dim
    for k, v in tensors.items():
        k = k.replace("model.word_embeddings.", "model.embed_tokens.")
        k = k.replace(".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias")
        k = k.replace(".mlp.shared_experts.", ".mlp.shared_expert.")
        m = _RING_LAYER.match(k)
        if m is None:
            out[k] = v
            continue
        pre, leaf = f"model.layers.{m[1]}.", m[2]
        if cfg.layer_types[int(m[1])] == "linear":
            out[pre + "linear_attn." + leaf] = v
        elif leaf.startswith("query_key_value."):
            q, kk, vv = v.split([q_rows, kv_rows, kv_rows])
            for name, part in (("q_proj", q), ("k_proj", kk), ("v_proj", vv)):
                out[pre + f"self_attn.{name}." + leaf.split(".", 1)[1]] = part
        else:
            head, rest = leaf.split(".", 1)
            out[pre + f"self_attn.{_RING_ATTN.get(head, head)}.{rest}"] = v
    return out


def _ling(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Ling 3 (``bailing_hybrid``): the hub layout (what transformers' ``save_pretrained`` writes:
    ``word_embeddings``, ``attention.*`` with ``dense`` for every layer, ``expert_bias``) -> transformers'
    module names, then Kimi Linear's renames (``_kimi``: gate tensors under ``forget_gate``, the q/k/v
    convs stacked)."""
    renamed: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        k = k.replace("model.word_embeddings.", "model.embed_tokens.")
        k = k.replace(".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias")
        m = _RING_LAYER.match(k)
        if m is not None:
            leaf = "o_proj." + m[2][len("dense.") :] if m[2].startswith("dense.") else m[2]
            k = f"model.layers.{m[1]}.self_attn.{leaf}"
        renamed[k] = v
    return _kimi(cfg, renamed)


_FALCON_LAYER = re.compile(
    r"^model\.layers\.(\d+)\.(input_layernorm|mamba|self_attn|pre_ff_layernorm|feed_forward)\.(.+)$"
)
_FALCON_HALF = {  # checkpoint module -> (which of our two layers, our module)
    "input_layernorm": (0, "input_layernorm"),
    "mamba": (0, "linear_attn"),
    "self_attn": (1, "self_attn"),
    "pre_ff_layernorm": (1, "post_attention_layernorm"),
    "feed_forward": (1, "mlp"),
}


def _falcon(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Falcon-H1 checkpoint layer i -> our layers 2i (``input_layernorm``, ``mamba`` -> ``linear_attn``) and
    2i+1 (``self_attn``, ``pre_ff_layernorm`` -> ``post_attention_layernorm``, ``feed_forward`` -> ``mlp``);
    ``final_layernorm`` -> ``norm``; a stored ``mup_vector`` dropped (recomputed from the config). Both
    namings share ``input_layernorm`` / ``self_attn``: a dict is in transformers' naming when it holds
    one of its own names, else it passes through."""
    if not any(".mamba." in k or ".feed_forward." in k or "final_layernorm" in k for k in tensors):
        return tensors
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        m = _FALCON_LAYER.match(k)
        if k.endswith(".mup_vector"):
            continue
        if m is None:
            out[k.replace("model.final_layernorm.", "model.norm.")] = v
            continue
        half, module = _FALCON_HALF[m[2]]
        out[f"model.layers.{2 * int(m[1]) + half}.{module}.{m[3]}"] = v
    return out


def to_contract(cfg: HybridConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' tensor names of ``cfg.family`` -> ours (see module doc)."""
    if cfg.family == "falcon_h1":
        return _falcon(tensors)
    if cfg.family == "bailing_moe_linear":
        return _ring(cfg, tensors)
    if cfg.family == "bailing_hybrid":
        return _ling(cfg, tensors)
    if cfg.family == "kimi_linear":
        return _kimi(cfg, tensors)
    if cfg.family == "minimax":
        return _minimax(cfg, tensors)
    if cfg.family == "nemotron_h":
        return _nemotron(cfg, tensors)
    if cfg.family == "lfm2":
        return {_rename(k, _LFM2): v for k, v in tensors.items()}
    if cfg.family != "granitemoehybrid":
        return tensors
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        m = _SHARED.match(k)
        if m is None:
            out[_rename(k, _GRANITE)] = v
            continue
        pre = m[1] + ("mlp.shared_expert." if cfg.num_experts else "mlp.")
        if m[2] == "input":  # [2I, D] = cat(gate, up)
            gate, up = v.chunk(2, dim=0)
            out[pre + "gate_proj.weight"], out[pre + "up_proj.weight"] = gate, up
        else:
            out[pre + "down_proj.weight"] = v
    return out
