"""Time the distillation step at the real shape with random weights (no files needed).

``python -m hypic_agent.training.bench --batch 16 --seq 2048 --gdn torch [--compile] [--chunk 128]``
(``--cached 128,8``: every step trains cached prefill, segments of 128 with seam 8)
prints one JSON line: GDN op forward+backward ms at ``[B, L, 9, 64]``, whole-step seconds,
tokens/s and peak CUDA memory. Run it first on a fresh GPU machine to pick the options that make
``hypic-agent distill`` fit its time budget.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from hypic_agent.runtime.models.hybrid import build_model
from hypic_agent.training.convert import ConvertOptions, student_hf_config
from hypic_agent.training.gdn_train import gdn_function, resolve_gdn_backend
from hypic_agent.training.hypic_forward import plan_for
from hypic_agent.training.step import StepOptions, train_step

# SmolLM2-135M-Instruct as its GGUF describes it
SMOLLM2_SHAPE: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": True,
}  # fmt: skip


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench(
    *,
    batch: int = 16,
    seq: int = 2048,
    gdn: str = "auto",
    compile: bool = False,
    chunk: int = 64,
    grad_checkpoint: bool = False,
    hidden_weight: float = 0.0,
    steps: int = 3,
    device: str = "cuda",
    shape: dict[str, Any] | None = None,
    cached: str | None = None,
) -> dict[str, Any]:
    dev = torch.device(device)
    backend = resolve_gdn_backend(gdn, dev)
    fn = gdn_function(backend, compile=compile, chunk=chunk)
    shape = shape or SMOLLM2_SHAPE
    torch.manual_seed(0)
    teacher = build_model(shape, device=dev).requires_grad_(False)
    student = build_model(student_hf_config(shape, ConvertOptions()), device=dev).train()
    for name, p in student.named_parameters():
        p.requires_grad_("_attn." in name)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95))
    h, dh = shape["num_attention_heads"], shape["head_dim"]
    q, k, v = (torch.randn(batch, seq, h, dh, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = (-torch.rand(batch, seq, h, device=dev) * 0.1).requires_grad_()
    beta = torch.rand(batch, seq, h, device=dev, dtype=torch.bfloat16).requires_grad_()
    times = []
    for _ in range(3):
        _sync(dev)
        t = time.perf_counter()
        fn(q, k, v, g, beta).float().square().mean().backward()
        _sync(dev)
        times.append(time.perf_counter() - t)
    ids = torch.randint(0, shape["vocab_size"], (batch, seq), device=dev)
    o = StepOptions(hidden_weight=hidden_weight, grad_checkpoint=grad_checkpoint)
    plan = None
    if cached:
        seg_len, seam = (int(v) for v in cached.split(","))
        plan = plan_for(seq, seg_len, seam, min_suffix=128)
    train_step(student, teacher, ids, opt, params, fn, o, cached=plan)  # warm-up (compile, autotune)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    _sync(dev)
    t = time.perf_counter()
    for _ in range(steps):
        train_step(student, teacher, ids, opt, params, fn, o, cached=plan)
    _sync(dev)
    step_s = (time.perf_counter() - t) / steps
    return {
        "batch": batch, "seq": seq, "gdn": backend, "compile": compile, "chunk": chunk,
        "grad_checkpoint": grad_checkpoint, "cached": cached, "gdn_fwd_bwd_ms": 1e3 * min(times[1:]), "step_s": step_s,
        "tok_s": batch * seq / step_s, "trainable_M": sum(p.numel() for p in params) / 1e6,
        "peak_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m hypic_agent.training.bench")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--gdn", default="auto")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--grad-checkpoint", action="store_true")
    ap.add_argument("--hidden-weight", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cached", default=None, help="SEGMENT_LEN,SEAM: time cached-prefill steps")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    print(json.dumps(bench(**{k.replace("-", "_"): v for k, v in vars(a).items()})), flush=True)


if __name__ == "__main__":
    main()
