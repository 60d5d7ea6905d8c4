"""The Gated DeltaNet gates in one Triton launch (CUDA; imported lazily). Twin: ``gdn_gates_torch``.

Token-local and tiny, but in torch they are ~9 launches per layer (casts, exp, softplus, products,
sigmoid): at decode batch sizes that is launch count, not bytes. Grid ``(cdiv(T * HV, BLOCK),)``;
rows of a and b may be strided (column slices of the fused input GEMM).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gdn_gates_kernel(a, b, A_log, dt_bias, g, beta, n, HV, stride_a, stride_b, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    t = offs // HV
    h = offs % HV
    x = tl.load(a + t * stride_a + h, mask=live, other=0.0).to(tl.float32)
    x = x + tl.load(dt_bias + h, mask=live, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's threshold 20
    decay = -tl.exp(tl.load(A_log + h, mask=live, other=0.0).to(tl.float32))
    tl.store(g + offs, decay * softplus, mask=live)
    y = tl.load(b + t * stride_b + h, mask=live, other=0.0).to(tl.float32)
    tl.store(beta + offs, (1.0 / (1.0 + tl.exp(-y))).to(beta.dtype.element_ty), mask=live)


def gdn_gates_triton(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``gdn_gates_torch``."""
    T, HV = a.shape
    if a.stride(-1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1:
        b = b.contiguous()
    g = torch.empty(T, HV, dtype=torch.float32, device=a.device)
    beta = torch.empty(T, HV, dtype=b.dtype, device=b.device)
    n = T * HV
    if n:
        block = 256
        _gdn_gates_kernel[(triton.cdiv(n, block),)](
            a, b, A_log.contiguous(), dt_bias.contiguous(), g, beta, n, HV, a.stride(0), b.stride(0), BLOCK=block,
            num_warps=2,
        )  # fmt: skip
    return g, beta
