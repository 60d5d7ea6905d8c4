"""Load a GGUF file (quantized llama.cpp checkpoint) into the naming contract, dequantized.

Supported ``general.architecture`` values (``families.GGUF_FAMILIES``, each family module's ``gguf``):

* ``llama`` and ``lfm2``: metadata through transformers' GGUF table (``GGUF_CONFIG_MAPPING``) and
  its per-architecture tensor processors (llama's Q/K row permutation undone, LFM2's squeezed conv);
* ``granitehybrid`` (Granite 4, served as ``granitemoehybrid``) and ``nemotron_h``: metadata and
  SSM tensor conventions mapped by us (``families/granitemoehybrid.py``, ``families/nemotron_h.py``),
  since transformers cannot read them;
* ``falcon-h1`` (``families/falcon_h1.py``: µP multipliers folded into the weights by the converter);
* ``qwen3next``, ``qwen35``, ``qwen35moe`` (``families/qwen3_5.py``, ``qwen3_next.py``: ``1 + w`` norms,
  split ``in_proj_qkvz``, Qwen3.5's tiled value-head order);
* ``kimi-linear`` (``families/kimi_linear.py``: split q/k/v convs, MLA's ``kv_b_proj`` split for the absorbed form).

Tensor names go through gguf-py's name map for the architecture, values through gguf-py's
dequantizer. We read the file once and map names for our own expected tensor set, instead of
``load_gguf_checkpoint(..., return_tensors=True)``, which parses the metadata twice and builds a
name map per submodule (3x slower on SmolLM2-135M).

Families we serve without GGUF loading: ``minimax``, ``bailing_moe_linear`` and ``bailing_hybrid``:
use their HF folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hypic_agent.errors import ModelConfigError, WeightsError
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.families import GGUF_FAMILIES, normalize_config
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily, GGUFMeta
from hypic_agent.runtime.models.loading.shapes import expected_shapes, validate_state_dict

# config sections read from the GGUF metadata ("<section>.<key>"); tokenizer ids included
_SECTIONS = ("general", "tokenizer")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id")
# contract tensors llama.cpp stores with squeezed / split dims (reshaped back when the count matches)
_RESHAPED = ("conv.weight", "conv1d.weight", ".A_log", ".D", "linear_attn.norm.weight")


def supported_archs() -> list[str]:
    """GGUF architectures ``load_gguf`` reads."""
    return sorted(GGUF_FAMILIES)


def _open(path: Path) -> Any:
    from gguf import GGUFReader

    if not path.is_file():
        raise WeightsError(f"GGUF file {str(path)!r} does not exist; pass an existing .gguf file", param="model")
    try:
        return GGUFReader(str(path))
    except Exception as e:  # gguf-py raises ValueError / struct errors on bad files
        raise WeightsError(f"cannot read {path} as GGUF ({e}); the file is corrupt or not a GGUF file") from e


def _field(reader: Any, key: str) -> Any:
    """A metadata value (a list for arrays of more than one element); float32 values as the shortest
    decimal that rounds to them, as config.json would have them."""
    from gguf import GGUFValueType
    from transformers.modeling_gguf_pytorch_utils import _gguf_parse_value

    f = reader.fields.get(key)
    if f is None:
        return None
    vals = [_gguf_parse_value(f.parts[i], f.types) for i in f.data]
    if f.types and f.types[-1] == GGUFValueType.FLOAT32:  # 1e-5 stored as float32 reads 9.99999974e-06
        vals = [float(str(np.float32(v))) for v in vals]
    return vals[0] if len(vals) == 1 else vals


def _family(reader: Any) -> GGUFFamily:
    arch = _field(reader, "general.architecture")
    fam = GGUF_FAMILIES.get(arch)
    if fam is not None and fam.config is None:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        if arch not in GGUF_CONFIG_MAPPING:  # an older transformers
            fam = None
    if fam is None:
        raise ModelConfigError(
            f"GGUF architecture {arch!r} is not supported (supported: {supported_archs()}); "
            "use the model's Hugging Face folder (config.json + safetensors) instead",
            param="model",
        )
    return fam


def _meta(reader: Any, arch: str) -> GGUFMeta:
    keys = [k for k in reader.fields if k.startswith(f"{arch}.")]
    keys += [f"tokenizer.ggml.{k}" for k in _TOKEN_IDS]
    shapes = {rt.name: tuple(int(x) for x in reversed(rt.shape.tolist())) for rt in reader.tensors}
    return GGUFMeta(arch=arch, fields={k: _field(reader, k) for k in keys}, shapes=shapes)


def _table_config(reader: Any, arch: str) -> dict[str, Any]:
    """The HF config dict through transformers' GGUF table (same keys as its GGUF loader)."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    cfg: dict[str, Any] = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}))
    for section in (*_SECTIONS, arch):
        table: dict[str, Any] = GGUF_CONFIG_MAPPING[section]  # type: ignore[assignment]
        for key, hf_key in table.items():
            if hf_key in (None, -1):
                continue
            value = _field(reader, f"{section}.{key}")
            if value is not None:
                cfg[hf_key] = value
    cfg["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in reader.fields:
        cfg["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    return cfg


def gguf_hf_config(reader: Any) -> dict[str, Any]:
    """The HF config dict (config.json keys of the family's ``model_type``) of a GGUF file."""
    fam = _family(reader)
    meta = _meta(reader, fam.arch)
    cfg = _table_config(reader, fam.arch) if fam.config is None else fam.config(meta)
    if fam.fixup is not None:
        cfg = fam.fixup(meta, cfg)
    cfg["model_type"] = fam.model_type
    return cfg


def _num_blocks(cfg: HybridConfig) -> int:
    """GGUF blocks: one per layer, except Nemotron-H's (a mixer or MLP block each)."""
    return max([cfg.num_layers, *(max(b) + 1 for b in cfg.hf_blocks)])


def _name_map(
    fam: GGUFFamily, cfg: HybridConfig, shapes: dict[str, tuple[int, ...]], present: set[str]
) -> dict[str, tuple[str, int]]:
    """GGUF tensor name -> (contract name, part index), for every tensor we expect. A name gguf-py
    maps with its ``.weight`` included (Falcon-H1's ``pre_ff_layernorm.weight`` -> ``ffn_norm``) is
    written by the converter without the suffix: the name the file holds wins."""
    from gguf import MODEL_ARCH, get_tensor_name_map

    names = get_tensor_name_map(MODEL_ARCH[fam.gguf_arch], _num_blocks(cfg))
    out: dict[str, tuple[str, int]] = {}
    for name in shapes:
        fused = fam.fused(cfg, name) if fam.fused is not None else None
        if fused:
            out.update({g: (name, k) for k, g in enumerate(fused)})
            continue
        hub = fam.hub(cfg, name) if fam.hub is not None else name
        base, _, suffix = hub.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, suffix = hub, ""
        g = names.get_name(base)
        g = g + (f".{suffix}" if suffix else "") if g is not None else names.get_name(hub)
        if g is not None and g not in present and g.rpartition(".")[0] in present:
            g = g.rpartition(".")[0]
        if g is not None:
            out[g] = (name, 0)
    return out


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (``LlamaModel.permute`` in convert_hf_to_gguf)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _convert(fam: GGUFFamily, name: str, w: np.ndarray, raw: dict[str, Any]) -> np.ndarray:
    """Undo the converter's value transforms of the families mapped by us (their ``GGUFFamily`` in ``families/``)."""
    if fam.permute_qk and name.endswith((".attn_q.weight", ".attn_q.bias")):
        w = _unpermute(w, int(raw["num_attention_heads"]))
    elif fam.permute_qk and name.endswith((".attn_k.weight", ".attn_k.bias")):
        w = _unpermute(w, int(raw["num_key_value_heads"]))
    elif name.endswith(".ssm_a"):  # stored A = -exp(A_log)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.log(-w)
    return fam.values(name, w, raw) if fam.values is not None else w


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
    fam = _family(reader)
    raw_cfg = gguf_hf_config(reader)
    cfg = normalize_config(raw_cfg)
    shapes = expected_shapes(cfg)
    mapping = _name_map(fam, cfg, shapes, {rt.name for rt in reader.tensors})
    contract = {g: n for g, (n, _) in mapping.items()}
    processor = TENSOR_PROCESSORS.get(fam.arch, TensorProcessor)(config=raw_cfg) if fam.config is None else None
    parts: dict[str, dict[int, np.ndarray]] = {}
    for rt in reader.tensors:
        target = mapping.get(rt.name)
        if target is None:
            continue
        try:
            w = dequantize(rt.data, rt.tensor_type)
        except NotImplementedError as e:
            raise WeightsError(f"{path}: tensor {rt.name} uses an unsupported quantization ({e})") from e
        if processor is not None:
            w = processor.process(weights=w, name=rt.name, tensor_key_mapping=contract, parsed_parameters={}).weights
        parts.setdefault(target[0], {})[target[1]] = _convert(fam, rt.name, np.asarray(w, dtype=np.float32), raw_cfg)
    tensors: dict[str, torch.Tensor] = {}
    for name, by_index in parts.items():
        arrays = [by_index[k] for k in sorted(by_index)]
        if fam.join is not None and (len(arrays) > 1 or (fam.fused is not None and fam.fused(cfg, name))):
            w = fam.join(name, arrays, raw_cfg)
        else:
            w = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=1)
        t = torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True))
        want = shapes[name]
        if tuple(t.shape) != want and name.endswith(_RESHAPED) and t.numel() == int(np.prod(want)):
            t = t.reshape(want)
        tensors[name] = t.to(device=device, dtype=dtype or torch.float32)
    validate_state_dict(cfg, tensors, where=str(path))
    return cfg, raw_cfg, tensors
