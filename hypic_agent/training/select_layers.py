"""Pick the teacher layers to keep as full attention: those its copying depends on most.

``python -m hypic_agent.training.select_layers --data .cache/distill/corpus --out sel.json --keep 15``

Probe (teacher in fp32, no grad): ``--prompts`` seeded prompts, each ``--context`` consecutive
tokens of the corpus followed by a verbatim repeat of a ``--span``-token piece of it taken from
its first 3/4 (so the original is far more than ``--window`` tokens back). A model copies the
repeat by attending back to the original (induction / retrieval heads); the layers that do it
are the ones a Gated DeltaNet replaces worst.

Score of layer l: the teacher runs with only layer l's attention cut to a causal sliding window
of ``--window`` tokens (``forward.attention_mixer``'s ``window``: query i sees keys
``i - w < j <= i``), every other layer unchanged;

* ``copy_loss[l]``: mean NLL of the repeated span's tokens from its ``skip + 1``-th on (the first
  ``skip`` tokens are where the copy is recognized), minus the unablated teacher's;
* ``lm_loss[l]``: the same difference over the context tokens (general language modelling).

``keep`` = the ``--keep`` layers of largest ``copy_loss`` (ties: lower index first), ascending;
printed as the ``--attention-layers`` value of ``hypic-agent distill``. Layers before l are
unaffected by the ablation, so each ablated run restarts from the cached input of layer l.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hypic_agent.errors import HypicError, InvalidRequestError
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.training.data import TokenData
from hypic_agent.training.forward import layer_forward


@dataclass(frozen=True)
class SelectOptions:
    """Probe settings (the command's arguments)."""

    teacher: str = "smollm2-135m-instruct"
    split: str = "eval"  # corpus split the prompts come from: eval (held-out) | train
    prompts: int = 16
    context: int = 1024
    span: int = 32
    skip: int = 4  # span tokens not scored (the copy is scored from the (skip + 1)-th token on)
    window: int = 64
    keep: int = 15
    batch: int = 4
    seed: int = 0


@dataclass
class LayerScores:
    """Per-layer NLL increases (nats / token) of the windowed teacher and the unablated NLLs."""

    copy_loss: list[float]  # [n_layers]
    lm_loss: list[float]  # [n_layers]
    base_copy_nll: float
    base_lm_nll: float


def copy_prompts(stream: np.ndarray, n: int, context: int, span: int, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    """``n`` prompts ``[n, context + span]`` int64 from the token ``stream``: ``context`` consecutive
    tokens, then a copy of ``span`` of them starting at a random offset ``p`` with
    ``p + span <= 3 * context // 4``. Returns (prompts, ``p [n]``); a function of ``seed``."""
    last = 3 * context // 4 - span
    if span < 1 or last < 0:
        raise InvalidRequestError(f"--span {span} must be >= 1 and fit the first 3/4 of --context {context}")
    room = stream.shape[0] - context
    if room < 0:
        raise InvalidRequestError(f"the corpus split has {stream.shape[0]} tokens, fewer than --context {context}")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, room + 1, size=n)
    offsets = rng.integers(0, last + 1, size=n)
    rows = []
    for s, p in zip(starts, offsets, strict=True):
        ctx = np.asarray(stream[s : s + context], dtype=np.int64)
        rows.append(np.concatenate([ctx, ctx[p : p + span]]))
    return torch.from_numpy(np.stack(rows)), offsets


def token_nll(model: HybridForCausalLM, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """NLL of ``ids[:, 1:]`` given final residuals ``h [B, L, D]`` -> ``[B, L-1]`` (fp32; one row of
    ``[L-1, vocab]`` logits at a time)."""
    return torch.stack([F.cross_entropy(model.logits(h[b, :-1]), ids[b, 1:], reduction="none") for b in range(len(h))])


@torch.no_grad()
def score_layers(
    model: HybridForCausalLM,
    prompts: torch.Tensor,
    context: int,
    window: int,
    *,
    skip: int = 4,
    batch: int = 4,
    log: Callable[[str], None] | None = None,
) -> LayerScores:
    """Per-layer copy / LM NLL increases when only that layer's attention is windowed.

    ``prompts [N, context + span]`` (``copy_prompts``); every layer of ``model`` must be attention.
    """
    n_layers = len(model.layers)
    if any(layer.self_attn is None for layer in model.layers):
        raise InvalidRequestError("select_layers probes an all-attention teacher")
    N, L = prompts.shape
    span = L - context
    if not 0 <= skip < span:
        raise InvalidRequestError(f"skip {skip} must be in [0, span {span})")
    dev = next(model.parameters()).device
    copy_cols = slice(context + skip - 1, L - 1)  # nll[:, t] is the NLL of ids[:, t + 1]
    lm_cols = slice(0, context - 1)
    copy_sum = torch.zeros(n_layers, dtype=torch.float64)
    lm_sum = torch.zeros(n_layers, dtype=torch.float64)
    base_copy = base_lm = 0.0
    t0 = time.perf_counter()
    for start in range(0, N, batch):
        ids = prompts[start : start + batch].to(dev)
        B = ids.shape[0]
        positions = torch.arange(L, device=dev).repeat(B)
        h = model.embed(ids)
        inputs: list[torch.Tensor] = []  # input of each layer [B, L, D]
        for i, layer in enumerate(model.layers):
            inputs.append(h)
            h = layer_forward(layer, h, positions, idx=i)
        base = token_nll(model, h, ids).double()  # [B, L-1]
        base_copy += float(base[:, copy_cols].sum())
        base_lm += float(base[:, lm_cols].sum())
        for lay in range(n_layers):
            h = inputs[lay]
            for i in range(lay, n_layers):
                h = layer_forward(model.layers[i], h, positions, idx=i, window=window if i == lay else None)
            diff = token_nll(model, h, ids).double() - base
            copy_sum[lay] += diff[:, copy_cols].sum().cpu()
            lm_sum[lay] += diff[:, lm_cols].sum().cpu()
        if log is not None:
            log(f"prompts {start + B}/{N}: {time.perf_counter() - t0:.0f} s")
    n_copy, n_lm = N * (span - skip), N * (context - 1)
    return LayerScores(
        copy_loss=(copy_sum / n_copy).tolist(),
        lm_loss=(lm_sum / n_lm).tolist(),
        base_copy_nll=base_copy / n_copy,
        base_lm_nll=base_lm / n_lm,
    )


def ranking(copy_loss: list[float]) -> list[int]:
    """Layer indices by decreasing ``copy_loss`` (ties: lower index first)."""
    return sorted(range(len(copy_loss)), key=lambda i: (-copy_loss[i], i))


def check_keep(keep: int, n: int) -> None:
    """``keep`` attention layers of ``n``: between 1 and half of them (else ``InvalidRequestError``)."""
    if not 1 <= keep <= n // 2:
        raise InvalidRequestError(f"--keep {keep}: between 1 and {n // 2} (half of the {n} layers) attention layers")


def keep_layers(copy_loss: list[float], keep: int) -> list[int]:
    """The ``keep`` layers of largest ``copy_loss``, ascending (at most half of the layers)."""
    check_keep(keep, len(copy_loss))
    return sorted(ranking(copy_loss)[:keep])


def layers_arg(layers: list[int]) -> str:
    """``[1, 3, 5]`` -> ``"1,3,5"`` (``hypic-agent distill --attention-layers``)."""
    return ",".join(str(i) for i in layers)


def select_layers(
    model: HybridForCausalLM, data: TokenData, opts: SelectOptions, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Build the prompts, score every layer, pick ``keep``. Returns the JSON report."""
    if opts.split not in ("eval", "train"):
        raise InvalidRequestError(f"--split must be eval or train, got {opts.split!r}")
    vocab = model.lm_head.weight.shape[0]
    if data.meta.vocab_size != vocab:
        raise InvalidRequestError(
            f"corpus {data.folder} was tokenized for a {data.meta.vocab_size}-token vocabulary, the teacher has {vocab}"
        )
    n = len(model.layers)
    check_keep(opts.keep, n)  # fail before the long part
    stream = data.eval if opts.split == "eval" else data.train
    prompts, offsets = copy_prompts(stream, opts.prompts, opts.context, opts.span, opts.seed)
    t0 = time.perf_counter()
    sc = score_layers(model, prompts, opts.context, opts.window, skip=opts.skip, batch=opts.batch, log=log)
    keep = keep_layers(sc.copy_loss, opts.keep)
    return {
        "args": {**asdict(opts), "data": str(data.folder)},
        "layers": n,
        "seconds": time.perf_counter() - t0,
        "span_offsets": offsets.tolist(),
        "base_copy_nll": sc.base_copy_nll,
        "base_lm_nll": sc.base_lm_nll,
        "copy_loss": sc.copy_loss,
        "lm_loss": sc.lm_loss,
        "ranking": ranking(sc.copy_loss),
        "keep": keep,
        "attention_layers": layers_arg(keep),
    }


def table(report: dict[str, Any]) -> str:
    """The per-layer scores as a text table (rank 1 = largest copy_loss; ``*`` = kept)."""
    rank = {layer: r + 1 for r, layer in enumerate(report["ranking"])}
    keep = set(report["keep"])
    lines = [f"{'layer':>5} {'copy_loss':>10} {'lm_loss':>10} {'rank':>5} keep"]
    for i, (c, m) in enumerate(zip(report["copy_loss"], report["lm_loss"], strict=True)):
        lines.append(f"{i:>5} {c:>10.4f} {m:>10.4f} {rank[i]:>5} {'*' if i in keep else ''}")
    lines.append(f"unablated NLL: copy {report['base_copy_nll']:.4f}, context {report['base_lm_nll']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    d = SelectOptions()
    ap = argparse.ArgumentParser(prog="python -m hypic_agent.training.select_layers", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--data", type=Path, required=True, help="token corpus (python -m hypic_agent.training.prepare)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    ap.add_argument("--teacher", default=d.teacher, help="catalog name, Llama .gguf file or HF folder, or 'tiny'")
    ap.add_argument("--split", default=d.split, choices=("eval", "train"))
    ap.add_argument("--prompts", type=int, default=d.prompts)
    ap.add_argument("--context", type=int, default=d.context, help="context tokens per prompt")
    ap.add_argument("--span", type=int, default=d.span, help="tokens of the repeated span")
    ap.add_argument("--skip", type=int, default=d.skip, help="first span tokens left out of copy_loss")
    ap.add_argument("--window", type=int, default=d.window, help="sliding window of the ablated layer")
    ap.add_argument("--keep", type=int, default=d.keep, help="layers to keep as attention")
    ap.add_argument("--batch", type=int, default=d.batch, help="prompts per forward")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from hypic_agent.training.teacher import load_teacher

    opts = SelectOptions(a.teacher, a.split, a.prompts, a.context, a.span, a.skip, a.window, a.keep, a.batch, a.seed)
    t0 = time.perf_counter()
    try:
        teacher = load_teacher(a.teacher, seed=a.seed)
        model = teacher.build(a.device)
        report = select_layers(model, TokenData(a.data), opts, log=lambda s: print(s, flush=True))
    except HypicError as e:
        raise SystemExit(f"error ({e.type}): {e.message}") from e
    report["total_seconds"] = time.perf_counter() - t0
    report["threads"] = torch.get_num_threads()
    print(table(report))
    print(f"{report['seconds']:.0f} s scoring ({report['total_seconds']:.0f} s in all, {report['threads']} threads)")
    print(f'--attention-layers "{report["attention_layers"]}"')
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
