"""Prefill throughput and TTFT of our runtime vs transformers on the same random weights.

    python benchmarks/prefill.py --shape qwen3_5_35b_a3b --lengths 4096 16384 32768
    python benchmarks/prefill.py --shape qwen3_next_80b_a3b --layers 24   # 80B does not fit one H200
    python benchmarks/prefill.py --shape tiny:qwen3_5_moe_text --device cpu --lengths 256   # smoke
    python benchmarks/prefill.py --shape kimi_linear_48b_a3b --no-transformers   # also granite_4_0_h_small

transformers' model shares our parameter tensors (built on the meta device, then assigned), so both
fit on one GPU. That needs our parameter names to be transformers' (the Qwen3.5 / Qwen3-Next shapes);
where they are not (Kimi Linear, Granite 4, ...) the run says so and times ours alone, or, with
``--transformers-own-weights``, builds transformers' model first with its own random init, times it
(a length it cannot run, e.g. out of memory, is recorded as such), frees it and then builds ours:
the same shapes, not the same weight values (MoE routing may differ a little).

    python benchmarks/prefill.py --shape granite_4_0_h_small --transformers-own-weights --lengths 4096 16384

FLOPs count matmuls, attention and the GDN recurrence (its formula stands in for the other linear kinds' too);
the fraction of peak is against a bf16 8192^3 matmul measured in the same run.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _common import (
    load_shape,
    matmul_peak_tflops,
    model_args,
    prefill_flops,
    print_table,
    random_model,
    timed,
    write_json,
)

from hypic_agent.runtime.runner.standalone import prefill


def hf_twin(model: Any, raw: dict[str, Any], device: str) -> Any:
    """transformers' CausalLM sharing ``model``'s parameters (no second copy of the weights)."""
    from transformers import AutoModelForCausalLM

    from hypic_agent.runtime.models.testing.tiny import hf_config_object

    text = raw.get("text_config", raw)
    if raw.get("model_type") in ("qwen3_5", "qwen3_5_moe"):
        text = dict(text)
    cfg = hf_config_object(text)
    kw: dict[str, Any] = {"torch_dtype": next(model.parameters()).dtype}
    with torch.device("meta"):
        try:
            hf = AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm", **kw)
        except (TypeError, ValueError):
            hf = AutoModelForCausalLM.from_config(cfg, **kw)
    sd = model.state_dict()
    if cfg.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    hf.load_state_dict(sd, assign=True, strict=True)
    rot = hf.model.rotary_emb
    hf.model.rotary_emb = type(rot)(config=hf.config).to(device)
    left = [n for n, b in hf.named_buffers() if b.is_meta]
    if left:
        raise RuntimeError(f"meta buffers left in the transformers twin: {left[:4]}")
    return hf.eval()


def hf_own_times(raw: dict[str, Any], args: argparse.Namespace, dtype: torch.dtype) -> dict[int, Any]:
    """transformers' model of ``raw`` with its own random init on the device: ``{length: (median s,
    all s)}``, or ``{length: "error ..."}`` where a length fails; the model is freed before returning."""
    from transformers import AutoModelForCausalLM

    from hypic_agent.runtime.models.testing.tiny import hf_config_object

    with torch.device(args.device):
        hf = AutoModelForCausalLM.from_config(hf_config_object(raw.get("text_config", raw)), torch_dtype=dtype).eval()
    vocab = hf.config.vocab_size
    out: dict[int, Any] = {}
    g = torch.Generator().manual_seed(0)
    for L in args.lengths:
        x = torch.randint(0, vocab, (1, L), generator=g).to(args.device)

        def run_hf(x=x, model=hf) -> None:
            with torch.no_grad():
                model(input_ids=x, logits_to_keep=1, use_cache=False)

        try:
            out[L] = timed(run_hf, reps=args.reps)
        except (RuntimeError, torch.OutOfMemoryError) as err:
            out[L] = f"error {type(err).__name__}: {str(err)[:120]}"
        print(
            f"L={L}: transformers (own weights) {out[L] if isinstance(out[L], str) else f'{out[L][0]:.3f}s'}",
            flush=True,
        )
    del hf, run_hf
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--transformers-own-weights", action="store_true", help="time transformers on its own init first")
    ap.add_argument("--out", default="bench_out/prefill.json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    raw = load_shape(args.shape, args.layers)
    own = hf_own_times(raw, args, dtype) if args.transformers_own_weights and not args.no_transformers else {}
    model = random_model(raw, args.device, dtype)
    cfg = model.config
    nparams = sum(p.numel() for p in model.parameters())
    peak = matmul_peak_tflops(args.device)
    hf = None
    if not args.no_transformers and not own:
        try:
            hf = hf_twin(model, raw, args.device)
        except (RuntimeError, ValueError, KeyError) as err:  # no twin on our parameter names for this family
            print(f"no transformers twin for {args.shape} ({type(err).__name__}: {str(err)[:160]}); ours only")
    rows = []
    g = torch.Generator().manual_seed(0)
    for L in args.lengths:
        ids = torch.randint(0, cfg.vocab_size, (L,), generator=g).tolist()
        fl = prefill_flops(cfg, L)
        t_ours, all_ours = timed(lambda ids=ids: prefill(model, [ids]), reps=args.reps)
        row: dict[str, Any] = {
            "shape": args.shape,
            "layers": cfg.num_layers,
            "tokens": L,
            "ours_s": t_ours,
            "ours_tok_s": L / t_ours,
            "ours_tflops": fl["total"] / t_ours / 1e12,
            "ours_frac_peak": fl["total"] / t_ours / 1e12 / peak,
            "all_ours": all_ours,
        }
        if hf is not None:
            x = torch.tensor([ids], device=args.device)

            def run_hf(x=x) -> None:
                with torch.no_grad():
                    hf(input_ids=x, logits_to_keep=1, use_cache=False)

            t_hf, all_hf = timed(run_hf, reps=args.reps)
            row.update(
                {
                    "hf_s": t_hf,
                    "hf_tok_s": L / t_hf,
                    "speedup": t_hf / t_ours,
                    "hf_frac_peak": fl["total"] / t_hf / 1e12 / peak,
                    "all_hf": all_hf,
                }
            )
        if isinstance(own.get(L), tuple):
            t_hf, all_hf = own[L]
            row.update(
                {"hf_s": t_hf, "hf_tok_s": L / t_hf, "speedup": t_hf / t_ours, "all_hf": all_hf, "hf_weights": "own"}
            )
        elif L in own:
            row["hf_error"] = own[L]
        row.update({f"flops_{k}": v for k, v in fl.items()})
        rows.append(row)
        print(
            f"L={L}: ours {t_ours:.3f}s" + (f", transformers {row['hf_s']:.3f}s" if "hf_s" in row else ""), flush=True
        )
    cols = ["shape", "layers", "tokens", "ours_s", "ours_tok_s", "ours_frac_peak", "hf_s", "hf_tok_s", "speedup"]
    print_table(rows, cols)
    write_json(
        args.out,
        {
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "peak_tflops": peak,
            "params": nparams,
            "dtype": args.dtype,
            "rows": rows,
            "torch": torch.__version__,
        },
    )


if __name__ == "__main__":
    main()
