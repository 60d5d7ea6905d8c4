"""The GGUF architectures ``load_gguf`` reads: ``general.architecture`` -> ``GGUFFamily``.

The mappings live one family (or family group) per module: ``gguf_families`` (``llama``, ``lfm2``,
``granitehybrid``, ``nemotron_h``), ``gguf_falcon`` (``falcon-h1``), ``gguf_qwen`` (``qwen3next``,
``qwen35``, ``qwen35moe``), ``gguf_kimi`` (``kimi-linear``).
"""

from __future__ import annotations

from hypic_agent.runtime.models.gguf_falcon import FALCON_H1
from hypic_agent.runtime.models.gguf_families import (
    granite_config,
    granite_fused,
    granite_hub,
    lfm2_config,
    lfm2_hub,
    nemotron_config,
    nemotron_hub,
)
from hypic_agent.runtime.models.gguf_kimi import KIMI_LINEAR
from hypic_agent.runtime.models.gguf_qwen import QWEN_FAMILIES
from hypic_agent.runtime.models.loading.gguf_meta import GGUFFamily

GGUF_FAMILIES: dict[str, GGUFFamily] = {
    f.arch: f
    for f in (
        GGUFFamily("llama", "llama", "LLAMA"),
        GGUFFamily("lfm2", "lfm2", "LFM2", fixup=lfm2_config, hub=lfm2_hub),
        GGUFFamily(
            "granitehybrid",
            "granitemoehybrid",
            "GRANITE_HYBRID",
            config=granite_config,
            hub=granite_hub,
            fused=granite_fused,
            permute_qk=True,
        ),
        GGUFFamily("nemotron_h", "nemotron_h", "NEMOTRON_H", config=nemotron_config, hub=nemotron_hub, permute_qk=True),
        FALCON_H1,
        *QWEN_FAMILIES,
        KIMI_LINEAR,
    )
}
"""GGUF ``general.architecture`` -> how to load it (see the family modules)."""
