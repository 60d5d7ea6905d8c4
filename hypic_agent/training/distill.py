"""``hypic-agent distill``: convert the teacher, distill the hybrid student against it, export it.

Loss per step: ``kl_weight * KL(teacher || student)`` on the next-token logits plus
``hidden_weight * hidden_loss`` (per-layer residual MSE). The first ``local_steps`` steps may
train each layer in isolation on the teacher's inputs (layer-local hidden loss only). AdamW
(betas 0.9 / 0.95), linear warmup then cosine to ``min_lr_ratio * lr``, gradient clipping,
bf16 autocast on CUDA. Only the token mixers train by default (``train="mixers"``).

Layout: ``cfg.convert`` picks the layers kept as attention (``ConvertOptions.attention_layers``,
e.g. from ``select_layers.py``; default every 4th). A resumed checkpoint or ``init_from`` model
keeps its own layout; an explicit ``attention_layers`` that differs from it is an error.

Cached-prefill training (``cached_every`` > 0): every ``cached_every``-th step the student runs
as the ``hypic`` mode serves it (``hypic_forward``: the block cut into equal segments cached in
isolation, seams and suffix recomputed in context) and the KL against the one-pass teacher is
taken at those recomputed tokens; segment length and seam are drawn per step from
``cached_segment_lens`` / ``cached_seams`` (a function of (seed, step)). The other steps are
plain distillation. ``cached_kl`` / ``cached_top1`` in the evals measure the served quality.

Runs span several processes: ``<out>/ckpt`` is saved every ``ckpt_every`` steps and at the end
(or when ``time_budget_s`` runs out); ``resume=True`` continues from it (the schedule is a
function of the step, batches of (seed, step)). At the end the held-out metrics are measured and
the model is exported to ``<out>/model`` (``delta.export_delta``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from hypic_agent.config import Settings
from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.models.hybrid import HybridForCausalLM, build_model
from hypic_agent.runtime.models.loading.delta import derived_tensors
from hypic_agent.training import checkpoint as ckpt
from hypic_agent.training.calibrate import collect_stats
from hypic_agent.training.convert import ConvertOptions, convert
from hypic_agent.training.data import CorpusSpec, TokenData, build_corpus, builtin_texts
from hypic_agent.training.delta import export_delta
from hypic_agent.training.forward import run_model
from hypic_agent.training.gdn_train import gdn_function, resolve_gdn_backend
from hypic_agent.training.hypic_forward import SegmentPlan, hypic_run, plan_for
from hypic_agent.training.losses import evaluate
from hypic_agent.training.schedule import cached_plan, lr_at
from hypic_agent.training.step import StepOptions, train_step
from hypic_agent.training.teacher import Teacher, load_teacher

TRAIN_MODES = ("gdn", "mixers", "mixers+norms", "all")
EXPORT_DTYPES = ("bfloat16", "float16", "float32", "int8")
CALIB_STEP = 1 << 40  # batch index of the calibration blocks (never a training step)


@dataclass
class DistillConfig:
    """Everything a run needs; stored in the checkpoint."""

    out: Path
    teacher: str = "smollm2-135m-instruct"
    steps: int = 300
    batch: int = 16
    seq: int = 2048
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    clip: float = 1.0
    kl_weight: float = 1.0
    hidden_weight: float = 0.0
    local_steps: int = 0
    temperature: float = 1.0
    train: str = "mixers"
    gdn: str = "auto"
    compile: bool = False
    gdn_chunk: int = 64
    grad_checkpoint: bool = False
    device: str = "auto"
    data: Path | None = None  # token corpus folder (built there if missing); default <out>/corpus
    shared_data: Path | None = None
    data_sources: tuple[str, ...] = ("passages", "docs", "python")
    max_corpus_tokens: int = 10_000_000
    eval_tokens: int = 262_144
    eval_batch: int = 8
    calib_tokens: int = 32_768
    ckpt_every: int = 50
    log_every: int = 10
    time_budget_s: float | None = None  # training seconds in total (all resumed runs); with steps=0 the
    # run takes as many steps as fit and the LR schedule runs over time instead of steps
    process_budget_s: float | None = None  # training seconds of this process (then checkpoint + export)
    init_from: Path | None = None  # start from an exported model folder (fresh optimizer) instead of converting
    stop_at: int | None = None  # stop this process at this step (the schedule still spans ``steps``)
    resume: bool = False
    seed: int = 0
    cached_every: int = 0  # every k-th step trains the cached-prefill (hypic-mode) KL; 0 = never
    cached_segment_lens: tuple[int, ...] = (64, 128, 256)
    cached_seams: tuple[int, ...] = (4, 8, 16)
    cached_min_suffix: int = 128
    cached_eval: tuple[int, int] = (128, 8)  # (segment length, seam) of the cached_kl eval; (0, 0) = off
    export_dtype: str = "bfloat16"
    shard_mb: float = 15.0
    convert: ConvertOptions = field(default_factory=ConvertOptions)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return json.loads(json.dumps(d, default=str))


def tiny_config(out: Path, **overrides: Any) -> DistillConfig:
    """The ``--tiny`` preset: tiny random Llama teacher, byte tokenizer, stdlib text, CPU, seconds."""
    base = DistillConfig(
        out=out, teacher="tiny", steps=30, batch=4, seq=64, lr=3e-3, warmup=3, device="cpu", gdn="torch",
        max_corpus_tokens=200_000, eval_tokens=2048, calib_tokens=1024, ckpt_every=10, log_every=5, shard_mb=0,
        export_dtype="float32",
    )  # fmt: skip
    return replace(base, **overrides)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _trainable(name: str, mode: str) -> bool:
    if mode not in TRAIN_MODES:
        raise InvalidRequestError(f"unknown --train mode {mode!r}; use one of {TRAIN_MODES}", param="train")
    if ".linear_attn." in name:
        return True
    if ".self_attn." in name:
        return mode != "gdn"
    if "norm.weight" in name:
        return mode in ("mixers+norms", "all")
    return mode == "all"


def corpus(cfg: DistillConfig, teacher: Teacher, log: Callable[[str], None]) -> TokenData:
    """The token corpus (built on first use)."""
    folder = cfg.data or cfg.out / "corpus"
    if not (folder / "meta.json").is_file():
        spec = CorpusSpec(sources=cfg.data_sources, shared_data=cfg.shared_data, max_tokens=cfg.max_corpus_tokens)
        docs = [("python", d) for d in builtin_texts()] if cfg.teacher == "tiny" else None
        log(f"building the token corpus in {folder} ...")
        meta = build_corpus(spec, teacher.tokenizer, folder, docs=docs, log=lambda s: None)
        log(f"corpus: {meta.train_tokens:,} train / {meta.eval_tokens:,} held-out tokens, {meta.docs}")
    data = TokenData(folder)
    if data.meta.vocab_size != int(teacher.hf_config["vocab_size"]):
        raise InvalidRequestError(
            f"corpus {folder} was tokenized for a {data.meta.vocab_size}-token vocabulary, the teacher has "
            f"{teacher.hf_config['vocab_size']}: point --data at a corpus built with this teacher's tokenizer"
        )
    return data


def build_student(
    cfg: DistillConfig, teacher: Teacher, tmodel: HybridForCausalLM, data: TokenData, dev: torch.device
) -> tuple[HybridForCausalLM, ckpt.TrainState, bool]:
    """Fresh conversion (calibrated on train blocks) or the resumed checkpoint."""
    folder = cfg.out / "ckpt"
    if cfg.resume and ckpt.has_checkpoint(folder):
        state, saved = ckpt.load_checkpoint(folder)
        if state.base != teacher.base:
            raise InvalidRequestError(f"checkpoint in {folder} was trained from {state.base}, not {teacher.base}")
        tensors = derived_tensors(teacher.tensors, bool(state.student_config.get("tie_word_embeddings")))
        tensors.update(saved)
        config, resumed = state.student_config, True
    elif cfg.init_from is not None:
        from hypic_agent.runtime.models.loading.weights import load_delta

        _, raw, tensors = load_delta(cfg.init_from, dtype=torch.float32)
        if raw["hypic_delta"]["base"] != teacher.base:
            raise InvalidRequestError(
                f"{cfg.init_from} was distilled from {raw['hypic_delta']['base']}, not {teacher.base}"
            )
        config = {k: v for k, v in raw.items() if k not in ("hypic_delta", "dtype")}
        resumed = False
        state = ckpt.TrainState(0, 0.0, config, teacher.base, cfg.to_json())
    else:
        seq = min(cfg.seq, 512)
        calib = data.batch(CALIB_STEP, max(1, cfg.calib_tokens // seq), seq, cfg.seed)
        stats = collect_stats(tmodel, calib, batch=cfg.eval_batch)
        conv = convert(teacher.hf_config, teacher.tensors, stats, cfg.convert)
        tensors, config, resumed = conv.tensors, conv.hf_config, False
        state = ckpt.TrainState(0, 0.0, config, teacher.base, cfg.to_json(), report=conv.report)
    student = build_model(config, device=dev)
    have, want = student.config.attention_layers, cfg.convert.attention_layers
    if (cfg.resume or cfg.init_from is not None) and want is not None and have != list(want):
        raise InvalidRequestError(
            f"the {'checkpoint' if resumed else '--init-from model'} has attention layers {have}, "
            f"not --attention-layers {list(want)}",
            param="attention_layers",
        )
    student.load_weights({k: v.to(dev) for k, v in tensors.items()})
    for name, p in student.named_parameters():
        p.requires_grad_(_trainable(name, cfg.train))
    return student.train(), state, resumed


def saved_tensors(student: HybridForCausalLM) -> dict[str, torch.Tensor]:
    """What the base lacks: every mixer tensor plus every trainable tensor."""
    out = {}
    for name, p in student.named_parameters():
        if p.requires_grad or ".linear_attn." in name or ".self_attn." in name:
            out[name] = p.detach()
    if student.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def run_distill(
    cfg: DistillConfig, log: Callable[[str], None] = print, settings: Settings | None = None
) -> dict[str, Any]:
    """Train (or resume), evaluate, export. Returns the summary written to ``<out>/model/distill.json``."""
    if cfg.export_dtype not in EXPORT_DTYPES:
        raise InvalidRequestError(f"--export-dtype must be one of {EXPORT_DTYPES}", param="export_dtype")
    dev = _device(cfg.device)
    torch.manual_seed(cfg.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    backend = resolve_gdn_backend(cfg.gdn, dev)
    gdn = gdn_function(backend, compile=cfg.compile, chunk=cfg.gdn_chunk)
    teacher = load_teacher(cfg.teacher, settings, seed=cfg.seed)
    cfg.convert.layer_types(int(teacher.hf_config["num_hidden_layers"]))  # bad --attention-layers fail here
    tmodel = teacher.build(dev)
    data = corpus(cfg, teacher, log)
    student, state, resumed = build_student(cfg, teacher, tmodel, data, dev)
    params = {n: p for n, p in student.named_parameters() if p.requires_grad}
    names = {p: n for n, p in params.items()}
    n_train = sum(p.numel() for p in params.values())
    attn_layers = student.config.attention_layers
    log(f"student: {len(student.config.linear_layers)} GDN + {len(attn_layers)} attention layers {attn_layers}; "
        f"{n_train / 1e6:.1f}M trainable ({cfg.train}); GDN backend {backend}; device {dev}")  # fmt: skip
    plist = list(params.values())
    opt = torch.optim.AdamW(plist, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sopts = StepOptions(cfg.kl_weight, cfg.hidden_weight, cfg.temperature, cfg.clip, cfg.grad_checkpoint)
    if resumed and not ckpt.restore_optimizer(cfg.out / "ckpt", opt, names, dev):
        log("resume: no optimizer state, AdamW moments start fresh")

    def final(model: HybridForCausalLM, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            return run_model(model, ids, gdn=gdn).final

    def cached(model: HybridForCausalLM, ids: torch.Tensor, plan: SegmentPlan) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            return hypic_run(model, ids, plan, gdn=gdn).final

    eval_blocks = data.eval_blocks(cfg.seq, cfg.eval_tokens)
    seg_len, seam = cfg.cached_eval
    fits = seg_len > 0 and seg_len + cfg.cached_min_suffix <= cfg.seq
    eval_plan = plan_for(cfg.seq, seg_len, seam, cfg.cached_min_suffix) if fits else None

    def metrics() -> dict[str, float]:
        plan = (eval_plan, cached) if eval_plan is not None else None
        return evaluate(student, tmodel, eval_blocks, final, batch=cfg.eval_batch, cached=plan)

    if not resumed:
        student.eval()
        state.evals.append({"step": 0, **metrics()})
        student.train()
        log(f"init: {state.evals[-1]}")
    t0, elapsed0, step = time.perf_counter(), state.elapsed_s, state.step
    last, last_step, start = time.perf_counter(), step, step
    end = cfg.steps if cfg.steps > 0 else 1 << 62
    end = min(end, cfg.stop_at) if cfg.stop_at is not None else end
    if cfg.steps <= 0 and not cfg.time_budget_s:
        raise InvalidRequestError("--steps 0 needs --time-budget (the schedule then runs over time)", param="steps")
    while step < end:
        ran = time.perf_counter() - t0
        if cfg.time_budget_s is not None and elapsed0 + ran >= cfg.time_budget_s:
            log(f"time budget of {cfg.time_budget_s:.0f} s of training reached at step {step}")
            break
        if cfg.process_budget_s is not None and ran >= cfg.process_budget_s:
            log(f"this process's budget of {cfg.process_budget_s:.0f} s reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step, elapsed0 + ran)
        ids = data.batch(step, cfg.batch, cfg.seq, cfg.seed).to(dev)
        plan = cached_plan(cfg, step)
        r = train_step(student, tmodel, ids, opt, plist, gdn, sopts, local=step < cfg.local_steps, cached=plan)
        step += 1
        if step % cfg.log_every == 0 or step == end or step == start + 1:
            now = time.perf_counter()
            rec = {"step": step, "loss": r.loss.item(), "kl": r.kl.item(), "hidden": r.hidden.item(),
                   "grad_norm": r.grad_norm.item(),
                   "cached": plan is not None, "lr": opt.param_groups[0]["lr"], "elapsed_s": elapsed0 + now - t0,
                   "tok_s": (step - last_step) * cfg.batch * cfg.seq / max(now - last, 1e-9)}  # fmt: skip
            state.history.append(rec)
            log(" ".join(f"{k}={v:.4g}" for k, v in rec.items()))
            last, last_step = now, step
        if cfg.ckpt_every and step % cfg.ckpt_every == 0:
            state.step, state.elapsed_s = step, elapsed0 + time.perf_counter() - t0
            ckpt.save_checkpoint(cfg.out / "ckpt", saved_tensors(student), state, opt, names)
    state.step, state.elapsed_s = step, elapsed0 + time.perf_counter() - t0
    ckpt.save_checkpoint(cfg.out / "ckpt", saved_tensors(student), state, opt, names)
    student.eval()
    state.evals.append({"step": step, **metrics()})
    log(f"step {step}: {state.evals[-1]}")
    ckpt.save_checkpoint(cfg.out / "ckpt", saved_tensors(student), state)
    summary = {"steps_done": step, "train_seconds": state.elapsed_s, "tokens_seen": step * cfg.batch * cfg.seq,
               "trainable_params": n_train, "gdn_backend": backend, "device": str(dev), "evals": state.evals,
               "attention_layers": attn_layers, "history": state.history, "init_report": state.report,
               "run": cfg.to_json()}  # fmt: skip
    export_delta(
        cfg.out / "model", state.student_config, saved_tensors(student), teacher.base, tokenizer=teacher.tokenizer,
        dtype=getattr(torch, cfg.export_dtype), shard_mb=cfg.shard_mb, summary=summary,
    )  # fmt: skip
    log(f"exported {cfg.out / 'model'}")
    return summary
