"""Feed-forward blocks: dense SwiGLU MLP and the sparse MoE block with a shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.kernels import moe as moe_ops
from hypic_agent.kernels import moe_route
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.layers.fused_inputs import FusedInputs, fuse


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``. x: ``[T, D]``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.fused_in: FusedInputs | None = None

    def fuse_inputs(self) -> list[FusedInputs]:
        """gate and up as one GEMM (``fused_inputs``)."""
        self.fused_in = fuse([(self.gate_proj, "weight"), (self.up_proj, "weight")])
        return [self.fused_in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_in is not None:
            gate, up = self.fused_in(x)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ReluSquaredMLP(nn.Module):
    """Nemotron-H's MLP: ``down(relu(up(x))^2)``. x: ``[T, D]``."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class Router(nn.Module):
    """Softmax top-k router; weights renormalized over the chosen experts when ``norm_topk``."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk: bool) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm_topk = norm_topk
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (top-k weights ``[T, k]`` in x.dtype, expert ids ``[T, k]``)."""
        return self.route(F.linear(x, self.weight))

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits ``[T, E]`` -> (top-k weights ``[T, k]``, expert ids ``[T, k]``)."""
        backend = "torch" if logits.requires_grad else "auto"  # the Triton top-k has no backward
        return moe_route.router_topk(logits, self.top_k, renormalize=self.norm_topk, backend=backend)


class SigmoidRouter(nn.Module):
    """Kimi Linear / DeepSeek-V3 routing: sigmoid scores; experts chosen by score + ``e_score_correction_bias``
    within the ``topk_group`` best of ``n_group`` groups (a group's worth: its two best); the chosen
    experts' scores renormalized (``norm_topk``) and times ``scaling``."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        e = cfg.num_experts
        self.top_k, self.norm_topk, self.scaling = (
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
            cfg.routed_scaling_factor,
        )
        self.groups, self.top_groups = cfg.router_groups
        self.weight = nn.Parameter(torch.zeros(e, cfg.hidden_size))
        self.e_score_correction_bias: torch.Tensor
        self.register_buffer("e_score_correction_bias", torch.zeros(e))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, D]`` -> (top-k weights ``[T, k]`` in x.dtype, expert ids ``[T, k]``)."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        if self.groups > 1:
            grouped = choice.view(x.shape[0], self.groups, -1)
            best = grouped.topk(2, dim=-1)[0].sum(-1).topk(self.top_groups, dim=-1)[1]
            keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
            choice = choice.masked_fill(~keep[..., None].expand_as(grouped).reshape_as(choice), float("-inf"))
        top_i = choice.topk(self.top_k, dim=-1)[1]
        top_w = scores.gather(1, top_i)
        if self.norm_topk:
            top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20)
        return (top_w * self.scaling).to(x.dtype), top_i


class Experts(nn.Module):
    """Fused expert weights: ``gate_up_proj [E, 2I, D]``, ``down_proj [E, D, I]``. ``kernels``: the
    kernel choices (``moe_triton_*``), set with ``HybridForCausalLM.set_kernels``."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.kernels: KernelConfig = DEFAULT_KERNELS

    def forward(self, x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        k = self.kernels
        return moe_ops.moe_experts(
            x, top_i, top_w, self.gate_up_proj, self.down_proj, max_slots=k.moe_triton_max_slots,
            block_m=k.moe_triton_block_m,
        )  # fmt: skip


class SparseMoE(nn.Module):
    """Routed experts plus a shared expert, sigmoid-gated (Qwen), ungated (Granite) or none (MiniMax).
    x: ``[T, D]``."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.gate: Router | SigmoidRouter = (
            SigmoidRouter(cfg)
            if cfg.router == "sigmoid"
            else Router(d, cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        )
        self.experts = Experts(cfg.num_experts, d, cfg.moe_intermediate_size)
        shared = cfg.shared_expert_intermediate_size
        self.shared_expert = MLP(d, shared) if shared else None  # MiniMax: routed experts only
        self.shared_expert_gate = nn.Linear(d, 1, bias=False) if shared and cfg.shared_expert_gate else None
        self.fused_in: FusedInputs | None = None

    def fuse_inputs(self) -> list[FusedInputs]:
        """The router, the shared expert's gate and up and its gate scalar as one GEMM (a softmax
        router with a gated shared expert: Qwen3.5 / Qwen3-Next; others keep their GEMMs)."""
        sh, sg = self.shared_expert, self.shared_expert_gate
        if not isinstance(self.gate, Router) or sh is None or sg is None:
            return []
        self.fused_in = fuse([(self.gate, "weight"), (sh.gate_proj, "weight"), (sh.up_proj, "weight"), (sg, "weight")])
        return [self.fused_in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_in is not None:
            assert isinstance(self.gate, Router) and self.shared_expert is not None
            logits, gate, up, shared_gate = self.fused_in(x)
            top_w, top_i = self.gate.route(logits)
            shared = torch.sigmoid(shared_gate) * self.shared_expert.down_proj(F.silu(gate) * up)
            return self.experts(x, top_i, top_w) + shared
        top_w, top_i = self.gate(x)
        routed = self.experts(x, top_i, top_w)
        if self.shared_expert is None:
            return routed
        shared = self.shared_expert(x)
        if self.shared_expert_gate is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        return routed + shared


def build_mlp(cfg: HybridConfig, layer_idx: int) -> nn.Module | None:
    """The layer's feed-forward block, or None for a layer without one (``cfg.ffn_layers``)."""
    if cfg.ffn_layers and not cfg.ffn_layers[layer_idx]:
        return None
    if cfg.moe_layers and cfg.moe_layers[layer_idx]:
        return SparseMoE(cfg)
    if cfg.ffn_act == "relu2":
        return ReluSquaredMLP(cfg.hidden_size, cfg.intermediate_size)
    return MLP(cfg.hidden_size, cfg.intermediate_size)
