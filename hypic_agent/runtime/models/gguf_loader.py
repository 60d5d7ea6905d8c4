"""Load a GGUF file (quantized llama.cpp checkpoint) into the naming contract, dequantized.

Built on transformers' GGUF support: its metadata -> config table (``GGUF_CONFIG_MAPPING``), its
per-architecture tensor processors (e.g. the reverse of llama.cpp's Q/K row permutation) and
gguf-py's tensor name map and dequantizer. We read the file once and map names for our own
expected tensor set, instead of ``load_gguf_checkpoint(..., return_tensors=True)``, which parses
the metadata twice and builds a name map per submodule (3x slower on SmolLM2-135M).

Supported: architectures both transformers' GGUF loader and our runtime know (``llama`` today;
Qwen3.5 / Qwen3-Next GGUFs are not readable by transformers yet: use their HF folders).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.config import FAMILIES, HybridConfig
from hypic_agent.runtime.models.loading import expected_shapes, validate_state_dict

# config sections read from the GGUF metadata ("<section>.<key>"); tokenizer ids included
_SECTIONS = ("general", "tokenizer")


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    if not path.is_file():
        raise WeightsError(f"GGUF file {str(path)!r} does not exist; pass an existing .gguf file", param="model")
    try:
        return GGUFReader(str(path))
    except Exception as e:  # gguf-py raises ValueError / struct errors on bad files
        raise WeightsError(f"cannot read {path} as GGUF ({e}); the file is corrupt or not a GGUF file") from e


def _field(reader: Any, key: str) -> Any:
    from transformers.modeling_gguf_pytorch_utils import _gguf_parse_value

    f = reader.fields.get(key)
    if f is None:
        return None
    vals = [_gguf_parse_value(f.parts[i], f.types) for i in f.data]
    return vals[0] if len(vals) == 1 else vals


def gguf_hf_config(reader: Any) -> dict[str, Any]:
    """The HF config dict of a GGUF file (same keys as transformers' GGUF loader produces)."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    arch = _field(reader, "general.architecture")
    if arch not in GGUF_CONFIG_MAPPING or arch not in FAMILIES:
        supported = sorted(set(GGUF_CONFIG_MAPPING) & set(FAMILIES))
        raise ModelConfigError(
            f"GGUF architecture {arch!r} is not supported (supported: {supported}); "
            "use the model's Hugging Face folder (config.json + safetensors) instead",
            param="model",
        )
    cfg: dict[str, Any] = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}))
    for section in (*_SECTIONS, arch):
        table: dict[str, Any] = GGUF_CONFIG_MAPPING[section]  # type: ignore[assignment]
        for key, hf_key in table.items():
            if hf_key in (None, -1):
                continue
            value = _field(reader, f"{section}.{key}")
            if value is not None:
                cfg[hf_key] = value
    cfg["model_type"] = arch
    cfg["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in reader.fields:
        cfg["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    return cfg


def _name_map(arch: str, cfg: HybridConfig) -> dict[str, str]:
    """GGUF tensor name -> contract name, for every tensor we expect."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    names = get_tensor_name_map(arch_id, cfg.num_layers)
    out: dict[str, str] = {}
    for hf_name in expected_shapes(cfg):
        base, _, suffix = hf_name.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, suffix = hf_name, ""
        g = names.get_name(base)
        if g is not None:
            out[g + (f".{suffix}" if suffix else "")] = hf_name
    return out


def load_gguf(
    path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> tuple[HybridConfig, dict[str, Any], dict[str, torch.Tensor]]:
    """Load a ``.gguf`` file: ``(HybridConfig, HF config dict, dequantized tensors by contract name)``.

    Quantized tensors are dequantized to float32, then cast to ``dtype`` if given.
    """
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    path = Path(path).expanduser()
    reader = _open(path)
    raw_cfg = gguf_hf_config(reader)
    cfg = HybridConfig.from_hf(raw_cfg)
    arch = raw_cfg["model_type"]
    mapping = _name_map(arch, cfg)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=raw_cfg)
    tensors: dict[str, torch.Tensor] = {}
    for rt in reader.tensors:
        try:
            w = dequantize(rt.data, rt.tensor_type)
        except NotImplementedError as e:
            raise WeightsError(f"{path}: tensor {rt.name} uses an unsupported quantization ({e})") from e
        res = processor.process(weights=w, name=rt.name, tensor_key_mapping=mapping, parsed_parameters={})
        name = mapping.get(res.name)
        if name is None:
            continue
        t = torch.from_numpy(np.array(res.weights, dtype=np.float32, order="C", copy=True))
        tensors[name] = t.to(device=device, dtype=dtype or torch.float32)
    validate_state_dict(cfg, tensors, where=str(path))
    return cfg, raw_cfg, tensors
