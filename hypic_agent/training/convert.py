"""Turn an all-attention Llama teacher into a Qwen3.5-style hybrid student (``qwen3_5_text``).

Layout: full attention at ``ConvertOptions.attention_layers`` when given (at most half of the
layers; ``select_layers.py`` picks them by measurement), else where ``i % every == every - 1``
(3, 7, ..., 27 for 30 layers); Gated DeltaNet elsewhere with as many key/value heads as the
teacher has query heads, head dims = the teacher's head dim, conv kernel 4. Vocabulary,
embeddings, MLPs and norms are the teacher's (RMSNorm weights shifted by -1: Qwen norms
compute ``y * (1 + w)``, Llama's ``y * w``).

Initialization of the mixers (``docs/models.md`` explains the choices):

* GDN: q rows and ``out_proj`` copied from the replaced attention, k / v rows from its KV heads
  repeated to every query head (GQA grouping), conv = current-token tap only (``conv_tap``; or
  per-head calibrated taps that keep SiLU in its near-linear range), ``in_proj_a`` /
  ``in_proj_b`` small random, ``A_log`` / ``dt_bias`` Mamba-style, output gate ``z`` held open
  through the calibrated constant direction ``u`` (``x . u ~= 1``), gated-norm weight = per-dim
  RMS of the teacher's attention output divided by the expected ``silu(z)``.
* kept attention: Qwen3.5 attention has an output gate, zero-centred q/k RMSNorm and partial
  RoPE. The student's attention heads are wider (``attn_head_dim`` 128: the teacher's 64 rotated
  dims + 64 un-rotated, as Qwen3.5's 256-wide heads rotate only 64); q / k / v copied into the
  rotated part, one extra dim of q and of k carries a large constant that makes the q/k RMSNorm
  a near-constant scale (see ``_attention_layer``); gate rows = ``attn_gate_target * u``
  (sigmoid ~ 0.98, compensated in ``o_proj``).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from hypic_agent.errors import InvalidRequestError, ModelConfigError
from hypic_agent.runtime.models.loading.delta import derived_tensors
from hypic_agent.training.calibrate import LayerStats

STUDENT_MODEL_TYPE = "qwen3_5_text"


@dataclass(frozen=True)
class ConvertOptions:
    """Layout and init knobs of the conversion.

    ``attention_layers``: indices of the layers kept as full attention (stored sorted; unique,
    non-negative, at most half of the layers); None: every ``attention_every``-th layer.
    """

    attention_every: int = 4
    attention_layers: tuple[int, ...] | None = None
    conv_tap: float | None = 1.0  # None: per-head calibrated taps (conv_alpha / head RMS)
    conv_alpha: float = 0.5
    z_target: float = 3.0  # GDN output-gate pre-activation (silu(3) = 2.86)
    attn_gate_target: float = 4.0  # attention output-gate pre-activation (sigmoid(4) = 0.98)
    ab_scale: float = 0.1  # in_proj_a / in_proj_b outputs ~ ab_scale * N(0, 1)
    beta_init: float | None = None  # None: beta ~ sigmoid(small) ~ 0.5
    a_range: tuple[float, float] = (1.0, 16.0)
    dt_range: tuple[float, float] = (1e-3, 1e-1)
    ridge: float = 1e-3
    attn_head_dim: int | None = 128  # kept attention head dim (None: the teacher's; see _attention_layer)
    attn_const_ratio: float = 20.0  # the constant q / k dim vs the largest mean per-head |q| / |k|
    seed: int = 0

    def __post_init__(self) -> None:
        if self.attention_layers is None:
            return
        try:
            layers = tuple(operator.index(i) for i in self.attention_layers if not isinstance(i, bool))
            ok = len(layers) == len(self.attention_layers) > 0
        except TypeError:
            ok = False
        if not ok:
            raise InvalidRequestError(
                f"attention_layers must be a non-empty list of layer indices, got {self.attention_layers!r}",
                param="attention_layers",
            )
        if min(layers) < 0:
            raise InvalidRequestError(f"attention_layers {list(layers)}: negative index", param="attention_layers")
        dup = sorted({i for i in layers if layers.count(i) > 1})
        if dup:
            raise InvalidRequestError(f"attention_layers repeats layer(s) {dup}", param="attention_layers")
        object.__setattr__(self, "attention_layers", tuple(sorted(layers)))

    def layer_types(self, n: int) -> list[str]:
        """``"full_attention"`` / ``"linear_attention"`` for each of ``n`` layers.

        Raises ``InvalidRequestError`` (a ``ValueError``) when an explicit layer is out of range or
        more than ``n // 2`` layers would be attention.
        """
        if self.attention_layers is None:
            k = self.attention_every
            return ["full_attention" if i % k == k - 1 else "linear_attention" for i in range(n)]
        bad = [i for i in self.attention_layers if i >= n]
        if bad:
            raise InvalidRequestError(
                f"attention_layers {bad} out of range: the model has {n} layers (0..{n - 1})", param="attention_layers"
            )
        if len(self.attention_layers) > n // 2:
            raise InvalidRequestError(
                f"{len(self.attention_layers)} attention layers of {n}: at most {n // 2} (half the layers stay linear)",
                param="attention_layers",
            )
        keep = set(self.attention_layers)
        return ["full_attention" if i in keep else "linear_attention" for i in range(n)]


def parse_layer_list(text: str | None) -> tuple[int, ...] | None:
    """``"1, 3,5"`` -> ``(1, 3, 5)``; empty / blank -> None (the ``--attention-layers`` option's format)."""
    if text is None or not text.strip():
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise InvalidRequestError(
            f"--attention-layers takes comma-separated layer indices like '3,7,11', got {text!r}",
            param="attention_layers",
        ) from e


@dataclass
class Conversion:
    """Result: HF config of the student, its tensors (naming contract) and per-layer init facts."""

    hf_config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    report: list[dict[str, float]] = field(default_factory=list)


def _mrope_section(half: int) -> list[int]:
    a = (half + 2) // 3
    b = (half - a + 1) // 2
    return [a, b, half - a - b]


def student_hf_config(teacher: dict[str, Any], opts: ConvertOptions) -> dict[str, Any]:
    """The ``qwen3_5_text`` config dict of the student of a Llama teacher config dict."""
    if teacher.get("model_type") != "llama":
        raise ModelConfigError(f"distillation converts llama teachers, got model_type {teacher.get('model_type')!r}")
    heads = int(teacher["num_attention_heads"])
    hidden = int(teacher["hidden_size"])
    head_dim = int(teacher.get("head_dim") or hidden // heads)
    rp = teacher.get("rope_parameters") or {}
    theta = float(rp.get("rope_theta", teacher.get("rope_theta", 10000.0)))
    n = int(teacher["num_hidden_layers"])
    attn_dim = opts.attn_head_dim or head_dim
    if attn_dim < head_dim + 2:
        attn_dim = head_dim
    return {
        "model_type": STUDENT_MODEL_TYPE,
        "architectures": ["Qwen3_5ForCausalLM"],
        "vocab_size": int(teacher["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(teacher["intermediate_size"]),
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": int(teacher.get("num_key_value_heads", heads)),
        "head_dim": attn_dim,
        "hidden_act": teacher.get("hidden_act", "silu"),
        "max_position_embeddings": int(teacher.get("max_position_embeddings", 2048)),
        "rms_norm_eps": float(teacher.get("rms_norm_eps", 1e-5)),
        "tie_word_embeddings": bool(teacher.get("tie_word_embeddings", False)),
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": theta,
            "partial_rotary_factor": head_dim / attn_dim,
            "mrope_section": _mrope_section(head_dim // 2),
            "mrope_interleaved": True,
        },
        "layer_types": opts.layer_types(n),
        "linear_num_key_heads": heads,
        "linear_num_value_heads": heads,
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "linear_conv_kernel_dim": 4,
        "bos_token_id": teacher.get("bos_token_id"),
        "eos_token_id": teacher.get("eos_token_id"),
        "pad_token_id": teacher.get("pad_token_id"),
    }


def _expected_silu(mu: float, sigma: float) -> float:
    z = torch.linspace(-4, 4, 801, dtype=torch.float64)
    w = torch.exp(-0.5 * z * z)
    return float((F.silu(mu + sigma * z) * w).sum() / w.sum())


def _expected_sigmoid(mu: float, sigma: float) -> float:
    z = torch.linspace(-4, 4, 801, dtype=torch.float64)
    w = torch.exp(-0.5 * z * z)
    return float((torch.sigmoid(mu + sigma * z) * w).sum() / w.sum())


def _repeat_heads(w: torch.Tensor, hkv: int, rep: int) -> torch.Tensor:
    """``[Hkv*Dh, D]`` -> ``[Hkv*rep*Dh, D]``: query head h reads KV head h // rep."""
    return w.view(hkv, -1, w.shape[-1]).repeat_interleave(rep, dim=0).reshape(-1, w.shape[-1])


def _gdn_layer(
    p: str, t: dict[str, torch.Tensor], st: LayerStats, cfg: dict[str, Any], opts: ConvertOptions, gen: torch.Generator
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    h, hkv, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], opts_head_dim(cfg)
    d = cfg["hidden_size"]
    rep = h // hkv
    wq, wk, wv, wo = (t[f"{p}self_attn.{n}_proj.weight"].float() for n in ("q", "k", "v", "o"))
    u, mean, std = st.gate_direction(opts.ridge)
    o: dict[str, torch.Tensor] = {}
    lp = p + "linear_attn."
    o[lp + "in_proj_qkv.weight"] = torch.cat([wq, _repeat_heads(wk, hkv, rep), _repeat_heads(wv, hkv, rep)])
    o[lp + "in_proj_z.weight"] = (opts.z_target * u.float())[None].expand(h * dh, d).clone()
    std_ab = opts.ab_scale / (math.sqrt(d) * st.x_rms)
    o[lp + "in_proj_a.weight"] = torch.randn(h, d, generator=gen) * std_ab
    o[lp + "in_proj_b.weight"] = torch.randn(h, d, generator=gen) * std_ab
    if opts.beta_init is not None:  # beta = sigmoid(b) ~ beta_init through the constant direction
        o[lp + "in_proj_b.weight"] += math.log(opts.beta_init / (1 - opts.beta_init)) * u.float() / mean
    conv = torch.zeros(3 * h * dh, 1, 4)
    if opts.conv_tap is None:  # per-head taps: alpha / RMS keeps silu near linear
        taps = [opts.conv_alpha / st.q_rms.float(), opts.conv_alpha / st.k_rms.float().repeat_interleave(rep)]
        taps.append(opts.conv_alpha / st.v_rms.float().repeat_interleave(rep))
        conv[:, 0, -1] = torch.cat(taps).repeat_interleave(dh)
    else:
        conv[:, 0, -1] = opts.conv_tap
    o[lp + "conv1d.weight"] = conv
    lo, hi = opts.a_range
    o[lp + "A_log"] = (lo + (hi - lo) * torch.rand(h, generator=gen)).log()
    dlo, dhi = (math.log(x) for x in opts.dt_range)
    dt = torch.exp(dlo + (dhi - dlo) * torch.rand(h, generator=gen))
    o[lp + "dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    e_silu = _expected_silu(opts.z_target * mean, opts.z_target * std)
    o[lp + "norm.weight"] = (st.o_ms.float().sqrt() / e_silu).clone()
    o[lp + "out_proj.weight"] = wo.clone()
    return o, {"gate_mean": mean, "gate_std": std, "e_silu_z": e_silu}


def _attention_layer(
    p: str, t: dict[str, torch.Tensor], st: LayerStats, cfg: dict[str, Any], opts: ConvertOptions
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Gated, q/k-normed attention that starts close to the teacher's plain attention.

    Per head the student's q / k get ``De - Dh`` extra (un-rotated) dims. One of them holds a
    large near-constant ``C * (x . u)`` (in q at dim ``Dh``, in k at dim ``Dh + 1``, so they never
    meet in ``q . k``): the per-head RMS is then dominated by it and nearly constant over tokens,
    and the norm weight ``C / sqrt(De)`` undoes it, so normalized q / k ~= the teacher's (relative
    error ~ |q|^2 / C^2). v's extra dims and their ``o_proj`` columns are zero.
    """
    h, hkv, dh, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], opts_head_dim(cfg), cfg["hidden_size"]
    de = cfg["head_dim"]
    sp = p + "self_attn."
    u, mean, std = st.gate_direction(opts.ridge)
    u = u.float()
    e_sig = _expected_sigmoid(opts.attn_gate_target * mean, opts.attn_gate_target * std)
    wq = t[sp + "q_proj.weight"].float().view(h, dh, d)
    wk = t[sp + "k_proj.weight"].float().view(hkv, dh, d)
    wv = t[sp + "v_proj.weight"].float().view(hkv, dh, d)
    wo = t[sp + "o_proj.weight"].float().view(d, h, dh)
    info = {"gate_mean": mean, "gate_std": std, "e_sigmoid_gate": e_sig}
    if de == dh:  # no room for the constant: plain norm weights = mean RMS (approximate)
        q_scale, k_scale = float(st.q_rms.mean()), float(st.k_rms.mean())
        q, k, v = wq, wk, wv
    else:
        c_q = opts.attn_const_ratio * float(st.q_rms.max()) * dh**0.5
        c_k = opts.attn_const_ratio * float(st.k_rms.max()) * dh**0.5
        q, k, v = (torch.cat([w, w.new_zeros(w.shape[0], de - dh, d)], dim=1) for w in (wq, wk, wv))
        q[:, dh] = c_q * u
        k[:, dh + 1] = c_k * u
        q_scale, k_scale = c_q / de**0.5, c_k / de**0.5
        wo = torch.cat([wo, wo.new_zeros(d, h, de - dh)], dim=2)
        info.update(q_const=c_q, k_const=c_k)
    gate = (opts.attn_gate_target * u)[None, None].expand(h, de, d)
    o = {
        sp + "q_proj.weight": torch.stack([q, gate], dim=1).reshape(2 * h * de, d).clone(),
        sp + "k_proj.weight": k.reshape(hkv * de, d).clone(),
        sp + "v_proj.weight": v.reshape(hkv * de, d).clone(),
        sp + "o_proj.weight": (wo.reshape(d, h * de) / e_sig).contiguous(),
        sp + "q_norm.weight": torch.full((de,), q_scale - 1.0),
        sp + "k_norm.weight": torch.full((de,), k_scale - 1.0),
    }
    return o, info


def opts_head_dim(cfg: dict[str, Any]) -> int:
    """The teacher's head dim (= the rotated dims and the GDN head dims of the student)."""
    return int(cfg["linear_key_head_dim"])


def convert(
    teacher_cfg: dict[str, Any],
    teacher: dict[str, torch.Tensor],
    stats: list[LayerStats],
    opts: ConvertOptions | None = None,
) -> Conversion:
    """Student config + initial tensors from teacher config / tensors and calibration stats."""
    opts = opts or ConvertOptions()
    cfg = student_hf_config(teacher_cfg, opts)
    if len(stats) != cfg["num_hidden_layers"]:
        raise ValueError(f"{len(stats)} layer stats for {cfg['num_hidden_layers']} layers")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ModelConfigError("num_attention_heads must be a multiple of num_key_value_heads")
    gen = torch.Generator().manual_seed(opts.seed)
    tensors = derived_tensors({k: v.float() for k, v in teacher.items()}, cfg["tie_word_embeddings"])
    report: list[dict[str, float]] = []
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        if kind == "linear_attention":
            new, info = _gdn_layer(p, teacher, stats[i], cfg, opts, gen)
        else:
            new, info = _attention_layer(p, teacher, stats[i], cfg, opts)
        tensors.update(new)
        report.append({"layer": float(i), "linear": float(kind == "linear_attention"), **info})
    return Conversion(cfg, {k: v.contiguous() for k, v in tensors.items()}, report)


def mixer_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the token-mixer tensors (what conversion creates; the rest is derived)."""
    return [n for n in tensors if ".linear_attn." in n or ".self_attn." in n]
