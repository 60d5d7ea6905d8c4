"""Kernel choices: one frozen value for the A/B switches of the kernels and the paths around them.

``Settings.kernels`` (``HYPIC_KERNELS__<FIELD>``) builds it; the engine builds one from its settings
and hands it down: to ``combine`` (which plans with it and keys its CUDA graphs on it), to the layer
graphs (``graph_bucket_step``), and to the model's modules that call a configurable kernel
(``HybridForCausalLM.set_kernels``: the MoE experts and the norms read their module's ``kernels``).
Kernel functions take the values as keyword arguments whose defaults are ``DEFAULT_KERNELS``', so
tests and tools that call them directly run the default paths.

No torch here: ``hypic_agent.config`` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelConfig:
    """Every kernel choice, with the defaults the project runs with.

    * ``precise_for_half``: whether the WY chain keeps its state's dots at about fp32 (tf32x3) for
      bf16 / fp16 outputs with fp32 pairs rather than one tf32 pass. One pass is about twice as fast
      at the Qwen3.5 combine shape (``benchmarks/combine_kernels.py``), state error ~1e-3 relative;
      the model's own forward (fla's chunk kernels) rounds the state to bf16 for its dots, so a tf32
      chain stays below the reference's own rounding.
    * ``moe_triton_max_slots``: (token, slot) pairs up to which CUDA runs the MoE's Triton kernels,
      above it the grouped GEMM. The Triton kernels read an expert's weights once per 16 of its rows;
      with the routing tables from one sort (``moe_triton.align``) a warm 210-token combine (1,680
      pairs) takes less GPU time than with the grouped GEMM (measured on the H200, see
      ``docs/benchmarks.md``; the earlier one-hot tables cost more than the GEMM, hence the old 512).
    * ``moe_triton_block_m``: rows per block of those Triton kernels (an expert's weights are read
      once per block of its rows); None: the kernels' default (16).
    * ``norm_fla_min_rows``: below this many rows the norms stay on torch: a few native launches
      cost less host time than fla's Python launch path, and the GPU work is tiny either way (short
      forwards: decode, combine).
    * ``graph_norms_fused``: inside a captured whole decode step (``runner.decode_graphs``) the norms
      take fla's fused kernel at any row count: the host launch cost ``norm_fla_min_rows`` avoids is
      paid once at capture, while the torch norm is ~7 kernels per call on every replay.
    * ``fuse_projections``: the engine runs the projections that read one input as one GEMM each
      (``HybridForCausalLM.fuse_projections``: GDN inputs, router + shared expert, MLP gate + up):
      fewer kernels per step, the same weights (views).
    * ``precompose_leading_bodies``: compose the bodies at the head of a ``w = 0`` prompt for all
      layers before the combine forward (``combine_inputs``); False runs them inside each layer's
      scan (kept for A/B measurements).
    * ``graph_bucket_step``: the layer graphs' token buckets above 2,048 rows
      (``runner.stage_graphs.bucket_sizes``).
    * ``graph_max_tokens``: the largest token bucket of the layer graphs; longer forwards run their
      token-local stages eagerly. Each (stage, layer, bucket) is captured on first use, with warm-up
      runs, and a served forward's row count (decodes + several combines + cold rows) takes many
      values: measured on the H200 (Qwen3.5-35B-A3B shape), lazily capturing buckets up to 8,192 rows
      held warm requests for seconds, while a forward of 2,048 rows is GPU-bound enough to run eagerly.
    * ``max_fused_cold_tokens``: above this many cold tokens a request's cold segments go through
      ``scatter_prefill``'s batches instead of its combine forward.
    * ``recurrent_scan_max_tokens``: KDA and decay-only (Mamba2, Lightning, Ring-linear) varlen scans
      of at most this many tokens in all run fla's fused recurrent kernels on CUDA instead of its
      chunked ones: a combine's active tokens (seams and the question: ~200) are short sequences,
      and the chunked kernels derive their chunk tables from ``cu_seqlens`` with a host read, which
      a CUDA graph cannot capture. 256 (the default) covers a combine, which is then capturable
      (faster warm TTFT on Kimi-48B and Granite-4.0-H-Small, ``docs/benchmarks.md``, ttft); 0: always
      chunked, and no combine graph for KDA / decay-only models.
    """

    precise_for_half: bool = False
    moe_triton_max_slots: int = 2048
    moe_triton_block_m: int | None = None
    norm_fla_min_rows: int = 512
    graph_norms_fused: bool = True
    fuse_projections: bool = True
    precompose_leading_bodies: bool = True
    graph_bucket_step: int = 128
    graph_max_tokens: int = 1024
    max_fused_cold_tokens: int = 65536
    recurrent_scan_max_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("moe_triton_max_slots", "norm_fla_min_rows", "max_fused_cold_tokens", "recurrent_scan_max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        bm = self.moe_triton_block_m
        if bm is not None and not (16 <= bm <= 256 and bm & (bm - 1) == 0):
            raise ValueError(f"moe_triton_block_m must be None or a power of two in [16, 256], got {bm}")
        if not 16 <= self.graph_bucket_step <= 8192:
            raise ValueError(f"graph_bucket_step must be in [16, 8192], got {self.graph_bucket_step}")


DEFAULT_KERNELS = KernelConfig()
"""The defaults (immutable): what kernel functions and modules use when given nothing else."""
