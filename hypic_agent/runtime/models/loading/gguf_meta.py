"""What every GGUF family mapping shares: the metadata view (``GGUFMeta``), the per-family record
(``GGUFFamily``) and the helpers reading keys all converters write the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hypic_agent.errors import ModelConfigError
from hypic_agent.runtime.models.config import HybridConfig


@dataclass
class GGUFMeta:
    """What the family mappings read from an open GGUF file: metadata values (``{arch}.`` keys
    by their suffix) and the logical (numpy) shape of every tensor."""

    arch: str
    fields: dict[str, Any]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """``{arch}.<key>`` (``general.*`` / ``tokenizer.*`` keys are passed in full)."""
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        v = self.fields.get(full)
        return default if v is None else v

    def require(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise ModelConfigError(f"GGUF ({self.arch}) lacks the metadata key {self.arch}.{key}", param="model")
        return v

    def has(self, tensor: str) -> bool:
        return tensor in self.shapes


def per_layer(value: Any, n: int) -> list[int]:
    """A per-layer array key (``head_count_kv``, ``feed_forward_length``): a list, or one scalar for all."""
    if isinstance(value, list):
        if len(value) != n:
            raise ModelConfigError(f"GGUF per-layer array has {len(value)} entries for {n} blocks", param="model")
        return [int(x) for x in value]
    return [int(value)] * n


def common_config(meta: GGUFMeta) -> dict[str, Any]:
    """Keys every family reads the same way: vocab, widths, eps, tokens, tying."""
    out: dict[str, Any] = {
        "hidden_size": int(meta.require("embedding_length")),
        "tie_word_embeddings": not meta.has("output.weight"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    vocab = meta.get("vocab_size")
    if vocab is None:
        vocab = meta.shapes.get("token_embd.weight", (0,))[0]
    out["vocab_size"] = int(vocab)
    return out


def rms_eps(meta: GGUFMeta) -> float:
    """RMSNorm eps: the converter writes ``layer_norm_rms_epsilon`` or (configs naming it
    ``layer_norm_epsilon``, as Nemotron-H's do) ``layer_norm_epsilon``."""
    eps = meta.get("attention.layer_norm_rms_epsilon", meta.get("attention.layer_norm_epsilon", 1e-5))
    return float(eps)


def mamba2_dims(meta: GGUFMeta) -> tuple[int, int, int, int, int]:
    """(heads, head dim, groups, state size, conv kernel) from the ``ssm.*`` keys."""
    heads = int(meta.require("ssm.time_step_rank"))
    inner = int(meta.require("ssm.inner_size"))
    if heads <= 0 or inner % heads:
        raise ModelConfigError(f"GGUF ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {heads}")
    groups = int(meta.require("ssm.group_count"))
    return heads, inner // heads, groups, int(meta.require("ssm.state_size")), int(meta.require("ssm.conv_kernel"))


@dataclass(frozen=True)
class GGUFFamily:
    """One GGUF architecture we load. ``config``: metadata -> HF config dict (None: transformers'
    ``GGUF_CONFIG_MAPPING`` table, then ``fixup``); ``hub``: our tensor name -> the checkpoint name
    llama.cpp's converter reads (then gguf-py's name map); ``fused``: names split into several GGUF
    tensors; ``permute_qk``: Q/K rows llama-permuted by the converter and undone here (families
    without a transformers tensor processor); ``values``: the family's own value transforms undone
    (GGUF tensor name, array, HF config dict -> array), after the shared ones; ``join``: how the parts
    of a ``fused`` tensor are put back (contract name, parts in ``fused`` order, HF config dict;
    default: concatenated along dim 1)."""

    arch: str  # general.architecture
    model_type: str
    gguf_arch: str  # gguf-py's MODEL_ARCH member name
    config: Callable[[GGUFMeta], dict[str, Any]] | None = None
    fixup: Callable[[GGUFMeta, dict[str, Any]], dict[str, Any]] | None = None
    hub: Callable[[HybridConfig, str], str] | None = None
    fused: Callable[[HybridConfig, str], tuple[str, ...] | None] | None = None
    permute_qk: bool = False
    values: Callable[[str, np.ndarray, dict[str, Any]], np.ndarray] | None = None
    join: Callable[[str, list[np.ndarray], dict[str, Any]], np.ndarray] | None = None
