"""The kernel part of ``Settings`` (``HYPIC_KERNELS__<FIELD>``): ``KernelSettings``, the validated edge
form of ``kernels.config.KernelConfig`` (the frozen dataclass the engine hands down)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig

_K = DEFAULT_KERNELS


class KernelSettings(BaseModel):
    """Kernel choices (``HYPIC_KERNELS__<FIELD>``, e.g. ``HYPIC_KERNELS__PRECISE_FOR_HALF=true``): the
    A/B switches of the kernels and the paths around them. ``config()`` gives the frozen
    ``kernels.config.KernelConfig`` the engine hands down; the defaults are its defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precise_for_half: bool = Field(
        default=_K.precise_for_half,
        description="WY chain state dots in tf32x3 for bf16 / fp16 outputs with fp32 pairs (false: one tf32 pass)",
    )
    moe_triton_max_slots: int = Field(
        default=_K.moe_triton_max_slots,
        ge=0,
        description="(token, slot) pairs up to which CUDA runs the MoE's Triton kernels (more: grouped GEMM)",
    )
    moe_triton_block_m: int | None = Field(
        default=_K.moe_triton_block_m,
        ge=16,
        le=256,
        description="rows per block of the MoE's Triton kernels (a power of two); null: the kernels' default (16)",
    )
    norm_fla_min_rows: int = Field(
        default=_K.norm_fla_min_rows, ge=0, description="fewer rows: the norms stay on torch (CUDA)"
    )
    graph_norms_fused: bool = Field(
        default=_K.graph_norms_fused,
        description="norms take the fused kernel at any row count inside a captured decode step",
    )
    fuse_projections: bool = Field(
        default=_K.fuse_projections,
        description="run the projections that read one input as one GEMM each (GDN inputs, router + shared expert)",
    )
    precompose_leading_bodies: bool = Field(
        default=_K.precompose_leading_bodies,
        description="compose a w = 0 prompt's leading bodies for all layers before the combine forward",
    )
    graph_bucket_step: int = Field(
        default=_K.graph_bucket_step,
        ge=16,
        le=8192,
        description="step of the layer graphs' token buckets above 2,048 rows",
    )
    graph_max_tokens: int = Field(
        default=_K.graph_max_tokens,
        ge=8,
        le=8192,
        description="largest token bucket of the layer graphs (longer forwards run their token-local stages eagerly)",
    )
    max_fused_cold_tokens: int = Field(
        default=_K.max_fused_cold_tokens,
        ge=0,
        description="more cold tokens: a request's cold segments are built apart from its combine forward",
    )
    recurrent_scan_max_tokens: int = Field(
        default=_K.recurrent_scan_max_tokens,
        ge=0,
        description="KDA / decay-only varlen scans of at most this many tokens run fla's fused recurrent kernels",
    )

    @model_validator(mode="after")
    def _check(self) -> KernelSettings:
        self.config()  # the dataclass's own checks (block_m a power of two)
        return self

    def config(self) -> KernelConfig:
        return KernelConfig(**self.model_dump())
