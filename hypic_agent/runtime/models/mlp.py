"""Feed-forward blocks: dense SwiGLU MLP and the sparse MoE block with a shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypic_agent.kernels import moe as moe_ops
from hypic_agent.kernels import moe_route
from hypic_agent.kernels.config import DEFAULT_KERNELS, KernelConfig
from hypic_agent.runtime.models.config import HybridConfig
from hypic_agent.runtime.models.fused_inputs import FusedInputs, fuse


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
    """Routed experts plus a sigmoid-gated shared expert. x: ``[T, D]``."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.gate = Router(d, cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        self.experts = Experts(cfg.num_experts, d, cfg.moe_intermediate_size)
        self.shared_expert = MLP(d, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(d, 1, bias=False)
        self.fused_in: FusedInputs | None = None

    def fuse_inputs(self) -> list[FusedInputs]:
        """The router, the shared expert's gate and up and its gate scalar as one GEMM."""
        sh = self.shared_expert
        self.fused_in = fuse(
            [
                (self.gate, "weight"),
                (sh.gate_proj, "weight"),
                (sh.up_proj, "weight"),
                (self.shared_expert_gate, "weight"),
            ]
        )
        return [self.fused_in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_in is not None:
            logits, gate, up, shared_gate = self.fused_in(x)
            top_w, top_i = self.gate.route(logits)
            shared = torch.sigmoid(shared_gate) * self.shared_expert.down_proj(F.silu(gate) * up)
        else:
            top_w, top_i = self.gate(x)
            shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, top_i, top_w) + shared


def build_mlp(cfg: HybridConfig, layer_idx: int) -> nn.Module:
    if cfg.moe_layers and cfg.moe_layers[layer_idx]:
        return SparseMoE(cfg)
    return MLP(cfg.hidden_size, cfg.intermediate_size)
