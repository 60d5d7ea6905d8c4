"""What every family module uses: the ``Family`` record, the shared ``HybridConfig`` builder and the
helpers that read config.json and tensor names the same way for several families."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig, LayerKind
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    """One architecture family: the ``model_type`` values it serves, how its config.json becomes a
    ``HybridConfig`` (``normalize``; the config's ``linear_kind`` names the mixer of its linear layers,
    ``layers/decoder.LINEAR_MIXERS``), how its checkpoint's tensor names become ours (``names``; None:
    they are ours already) and which GGUF architectures load as it (``gguf``)."""

    name: str  # ``HybridConfig.family``
    model_types: tuple[str, ...]
    normalize: Callable[[dict[str, Any], str], HybridConfig]  # (config.json dict, model_type)
    names: Callable[[HybridConfig, Tensors], Tensors] | None = None  # safe to apply twice
    # a checkpoint name before per-expert tensors are fused (``loading.safetensors.map_checkpoint_names``)
    expert_names: Callable[[str], str] | None = None
    # True: the tensors a config needs are read off its model built on the meta device; False: the
    # Qwen / Llama table in ``loading/shapes.py``
    shapes_from_model: bool = True
    gguf: tuple[GGUFFamily, ...] = ()


# ---------------------------------------------------------------------------- config.json
def hybrid_config(
    raw: dict[str, Any],
    model_type: str,
    family: str,
    layer_types: tuple[LayerKind, ...],
    *,
    heads: tuple[int, int, int],
    rope: tuple[float, int] = (10000.0, 0),
    eps: float,
    eps_key: str = "rms_norm_eps",
    max_positions: int,
    tie: bool | None = None,
    read_act: bool = True,
) -> HybridConfig:
    """The ``HybridConfig`` fields every family reads the same way (vocabulary, widths, norm eps, tying,
    context length, attention heads, RoPE, token ids) plus what most families share (plain ``y * w``
    norms, attention without an output gate or q/k norms, no MoE layer); a normalizer ``replace``s the
    rest. ``heads``: (query heads, key/value heads, head dim); ``rope``: (theta, rotated dims; 0: no
    RoPE); ``eps`` / ``eps_key``: the norm eps key and its default; ``max_positions``: the default
    context length; ``tie``: the tying (None: ``tie_word_embeddings``, default False);
    ``read_act``: whether the config's ``hidden_act`` is the MLP's (else SiLU)."""
    q_heads, kv_heads, head_dim = heads
    theta, rotary_dim = rope
    return HybridConfig(
        model_type=model_type,
        family=family,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        layer_types=layer_types,
        rms_norm_eps=float(raw.get(eps_key, eps)),
        norm_zero_centered=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)) if tie is None else tie,
        hidden_act=str(raw.get("hidden_act", "silu")) if read_act else "silu",
        max_position_embeddings=int(raw.get("max_position_embeddings", max_positions)),
        num_attention_heads=q_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        attn_output_gate=False,
        qk_norm=False,
        attention_bias=bool(raw.get("attention_bias", False)),
        moe_layers=tuple(False for _ in layer_types),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_of(raw),
    )


def gqa_heads(raw: dict[str, Any], *, kv_default: bool = False) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim) of a config's GQA attention: ``head_dim`` or hidden /
    heads; key/value heads as many as query heads when ``num_key_value_heads`` is absent, or (with
    ``kv_default``, transformers' reading) also when it is null or 0."""
    heads = int(raw["num_attention_heads"])
    kv = (raw.get("num_key_value_heads") or heads) if kv_default else raw.get("num_key_value_heads", heads)
    return heads, int(kv), int(raw.get("head_dim") or int(raw["hidden_size"]) // heads)


def rope_of(raw: dict[str, Any], head_dim: int) -> tuple[float, int]:
    """(theta, rotary dims) of a config dict: ``rope_parameters`` / ``rope_scaling`` or top level."""
    rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(rp.get("rope_theta", raw.get("rope_theta", 10000.0)))
    factor = float(rp.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in ("default", None):
        raise ModelConfigError(f"rope_type {rope_type!r} is not supported yet (only 'default')")
    return theta, int(head_dim * factor)


def eos_of(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def layer_kinds(types: list[str], linear: tuple[str, ...], attention: tuple[str, ...]) -> tuple[LayerKind, ...]:
    """A config's layer type names -> ``linear`` / ``attention`` (``ModelConfigError`` for others)."""
    out: list[LayerKind] = []
    for t in types:
        if t in linear:
            out.append("linear")
        elif t in attention:
            out.append("attention")
        else:
            raise ModelConfigError(f"unknown layer type {t!r} in layer_types")
    return tuple(out)


def json_float(x: Any) -> float:
    """A number of config.json; transformers writes infinities as ``{"__float__": "Infinity"}``."""
    return float(x["__float__"]) if isinstance(x, dict) else float(x)


# ---------------------------------------------------------------------------- tensor names
LAYER = re.compile(r"^model\.layers\.(\d+)\.([a-z_]+)\.(.+)$")  # our layer tensor: (index, module, leaf)
LAYER_PREFIX = r"^(model\.layers\.\d+\.)"


def rename(name: str, rules: list[tuple[re.Pattern[str], str]]) -> str:
    """``name`` after the first rule that matches it."""
    for pat, rep in rules:
        name, n = pat.subn(rep, name)
        if n:
            return name
    return name


_MIXTRAL_EXPERT = re.compile(LAYER_PREFIX + r"mlp\.experts\.(\d+)\.w([123])\.weight$")
_W = {"1": "gate", "2": "down", "3": "up"}


def mixtral_expert_name(name: str) -> str:
    """Hub checkpoints (MiniMax, Kimi Linear) keep the MoE under ``block_sparse_moe`` with Mixtral-style
    experts (``experts.{e}.w1/w2/w3``): renamed to ``mlp.experts.{e}.{gate,down,up}_proj`` (``mlp.gate``)."""
    name = name.replace(".block_sparse_moe.", ".mlp.")
    m = _MIXTRAL_EXPERT.match(name)
    return name if m is None else f"{m[1]}mlp.experts.{m[2]}.{_W[m[3]]}_proj.weight"


def mamba_leaf(leaf: str) -> str:
    """llama.cpp's converter renames a Mamba2 ``dt_bias`` to ``dt_proj.bias`` (-> GGUF ``ssm_dt.bias``)."""
    return "dt_proj.bias" if leaf == "dt_bias" else leaf
