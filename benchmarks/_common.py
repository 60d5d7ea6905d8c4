"""Shared helpers for benchmarks: random real-shape models, timing, FLOP counts, table + JSON output."""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))

from hypic_agent.runtime.models.config import HybridConfig  # noqa: E402
from hypic_agent.runtime.models.hybrid import HybridForCausalLM  # noqa: E402
from hypic_agent.runtime.models.testing import random_weights  # noqa: E402


def model_args(ap: argparse.ArgumentParser, layers: int | None = None) -> argparse.ArgumentParser:
    """The arguments every real-shape benchmark takes: --shape --layers --device --dtype."""
    ap.add_argument("--shape", default="qwen3_5_35b_a3b", help="shared config name, a path, or tiny:<arch>")
    ap.add_argument("--layers", type=int, default=layers, help="cut the model to this many layers")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    return ap


def load_shape(name_or_path: str, layers: int | None = None) -> dict[str, Any]:
    """A real config from shared/configs (or a path / tiny:<arch>), optionally cut to ``layers`` layers."""
    if name_or_path.startswith("tiny:"):
        from hypic_agent.runtime.models.testing.tiny import tiny_config

        raw = tiny_config(name_or_path[5:])
    else:
        p = Path(name_or_path)
        for cand in (
            ROOT / "benchmarks" / "configs" / f"{name_or_path}.json",
            SHARED / "configs" / f"{name_or_path}.json",
        ):
            if not p.exists():
                p = cand
        raw = json.loads(p.read_text())
    if layers:
        text = raw.get("text_config", raw)
        text["num_hidden_layers"] = layers
        if "layer_types" in text:
            text["layer_types"] = text["layer_types"][:layers]
    return raw


def random_model(raw: dict[str, Any], device: str, dtype: torch.dtype, seed: int = 0) -> HybridForCausalLM:
    """Our model at the config's real size with seeded random weights drawn on the device
    (``runtime/models/random_weights.py``: what ``--model random:<config.json>`` serves)."""
    return random_weights.random_model(raw, seed=seed, dtype=dtype, device=torch.device(device))[0]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def busy_ms(intervals: list[tuple[int, int]]) -> float:
    """Union length of ``(start_us, end_us)`` kernel intervals, ms."""
    busy, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        busy += cur_e - cur_s
    return busy / 1e3


def gpu_busy_ms(fn: Callable[[], Any]) -> float:
    """GPU-busy time of one warm ``fn()`` call (union of its CUDA kernel intervals in a
    ``torch.profiler`` trace), ms; 0 off CUDA. Shows what a call costs the GPU when its wall time is
    set by the host (Python and launches)."""
    if not torch.cuda.is_available():
        return 0.0
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return busy_ms([(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == cuda])


def host_syncs(fn: Callable[[], Any]) -> tuple[Any, collections.Counter[str]]:
    """``fn()`` under ``torch.cuda.set_sync_debug_mode("warn")``: its result and its host<->device
    synchronisations per ``file:line`` (on every thread: the warning filter is process-wide)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    lines = collections.Counter(
        f"{w.filename.split('/')[-1]}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
    )
    return out, lines


def device_ms(fn: Callable[[], Any], reps: int = 5, warmup: int = 2) -> float:
    """Median time of ``fn()`` in ms: on CUDA the device time between events around each call
    (``triton.testing.do_bench``, L2 flushed between calls, so data is read from HBM as in a request);
    elsewhere the wall time (``timed``)."""
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return timed(fn, reps=reps, warmup=warmup)[0] * 1e3


def timed(fn: Callable[[], Any], reps: int = 3, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall seconds over ``reps`` after ``warmup`` calls (device synchronized)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], times


def prefill_flops(cfg: HybridConfig, L: int) -> dict[str, float]:
    """FLOPs of one prefill of L tokens (matmuls count 2 per MAC; logits for the last token only)."""
    d = cfg.hidden_size
    mm = 0.0
    for i, kind in enumerate(cfg.layer_types):
        if kind == "linear":
            proj = d * (cfg.linear_conv_dim + cfg.linear_value_dim + 2 * cfg.linear_num_value_heads)
            mm += 2 * L * (proj + cfg.linear_value_dim * d)
        else:
            q = cfg.num_attention_heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)
            kv = 2 * cfg.num_key_value_heads * cfg.head_dim
            mm += 2 * L * d * (q + kv + cfg.num_attention_heads * cfg.head_dim)
        if cfg.moe_layers and cfg.moe_layers[i]:
            per_tok = cfg.num_experts * d + cfg.num_experts_per_tok * 3 * d * cfg.moe_intermediate_size
            per_tok += 3 * d * cfg.shared_expert_intermediate_size + d
            mm += 2 * L * per_tok
        else:
            mm += 2 * L * 3 * d * cfg.intermediate_size
    mm += 2 * d * cfg.vocab_size
    n_attn = len(cfg.attention_layers)
    attn = n_attn * 2 * L * L * cfg.num_attention_heads * cfg.head_dim  # causal: QK^T + PV over L^2/2
    hv, k, v, c = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, 64
    gdn = len(cfg.linear_layers) * L * hv * (6 * k * v + 4 * c * (k + v))
    return {"matmul": mm, "attention": attn, "gdn": gdn, "total": mm + attn + gdn}


def matmul_peak_tflops(device: str) -> float:
    """Measured bf16 matmul rate (8192^3) on this device, TFLOP/s."""
    if not device.startswith("cuda"):
        return float("nan")
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    t, _ = timed(lambda: a @ b, reps=10, warmup=3)
    return 2 * 8192**3 / t / 1e12


def print_table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else (f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}")
        return str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols]
    print(" | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(cols, widths, strict=True)))


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None (with a note) where matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return None
    return plt


def save_figure(fig: Any, path: str | Path) -> None:
    """Lay out a matplotlib figure and write it as PNG (folders created)."""
    p = Path(path)
    fig.tight_layout()
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    print(f"wrote {p}")


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {p}")


class NoText:
    """A tokenizer stand-in for engines fed token ids (``qps.py``, ``ttft.py``): no stop strings, so
    nothing is decoded to text."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def kernel_summary(prof: Any, top: int = 30) -> dict[str, Any]:
    """The CUDA kernels a ``torch.profiler.profile`` saw (a CUDA-graph replay shows its kernels too): their
    number, summed GPU time, the span from the first kernel's start to the last one's end, and the
    ``top`` kernels by total time with their counts. GPU time well under the span: the GPU waited for
    the host."""
    from collections import defaultdict

    from torch.autograd import DeviceType

    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        per[e.name][0] += 1
        per[e.name][1] += getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0)
    total_us = sum(t for _, t in per.values())
    span_us = max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels) if kernels else 0.0
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
    print(f"{len(kernels)} kernels, {total_us / 1e3:.2f} ms GPU time over a {span_us / 1e3:.2f} ms span", flush=True)
    for name, (n, t) in rows:
        print(f"  {t:9.1f} us  {int(n):5d}x  {name[:110]}", flush=True)
    return {
        "kernels": len(kernels),
        "gpu_ms": total_us / 1e3,
        "span_ms": span_us / 1e3,
        "top": [[k, n, t] for k, (n, t) in rows],
    }


def decode_tokens(batch: int, vocab: int, step: int) -> list[list[int]]:
    """One token per row, each row its own (seeded by ``step``): a batch of real requests feeds different
    tokens, so an MoE routes its rows to different experts (64 rows of one Qwen3.5-35B-A3B token read 8
    of its 256 experts' weights per layer; 64 different tokens read ~220 of them). Feeding every row the
    same token, or a random model's argmax (it picks the same few tokens whatever the input), measures
    a step that reads a fraction of the weights a served batch reads."""
    return [[t] for t in random.Random(f"decode/{batch}/{step}").sample(range(1, vocab), batch)]


def decode_step_ms(
    runner: Any,
    pool: Any,
    batch: int,
    context: int,
    steps: int,
    warmup: int = 3,
    after: Callable[[list[Any], list[list[int]]], Any] | None = None,
) -> list[float] | None:
    """``decode.py``'s timed loop on a ``ModelRunner`` over its ``StatePool``: ``batch`` sequences whose
    pool state holds ``context`` tokens (the pool's zeros: the work and bytes of real requests of that
    length) decode ``warmup + steps`` steps through the scheduler's critical path (plan -> forward,
    replayed from the batch bucket's CUDA graph where the runner has them -> device argmax -> one
    read-back of the ids). Each step feeds every row a different token (``decode_tokens``), as a
    served batch does. Returns the ms of each timed step, or None when the pool cannot hold the
    sequences; ``after(seqs, tokens)`` runs on the live sequences after the timed steps; they are
    freed again either way."""
    seqs = [pool.alloc(context + steps + warmup + 2) for _ in range(batch)]
    try:
        if any(s is None for s in seqs):
            return None
        for s in seqs:
            s.length = context - 1
        vocab = runner.model.config.vocab_size
        times = []
        for i in range(warmup + steps):
            toks = decode_tokens(batch, vocab, i)
            sync()
            t0 = time.perf_counter()
            logits = runner.forward(runner.plan(seqs, toks))
            logits.argmax(-1).tolist()  # the scheduler's one read-back per step
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        if after is not None:
            after(seqs, decode_tokens(batch, vocab, warmup + steps))
        return times
    finally:
        for s in seqs:
            if s is not None:
                pool.free(s)


class ServeProcess:
    """``hypic-agent serve`` as a user runs it (the CLI: ``python -m hypic_agent.cli serve``) in a child
    process on 127.0.0.1 and a free port (``--port 0``, read back from its ``"listening"`` log line),
    with the settings in ``env`` (``HYPIC_*``). Its log (JSON lines on stderr) is copied to ``log_path``
    as it comes; ``stages`` holds the start-up lines (logger ``hypic.startup``, heartbeats left out)
    with the server's ``elapsed_s`` and ``t_s``, seconds since the spawn; ``startup_s`` is spawn ->
    ``"listening"``. ``start`` waits for that line (at most ``start_timeout_s``); ``stop`` (also on
    any failure of ``start`` and at the end of a ``with`` block) terminates the process, then kills
    it if it has not exited within ``stop_timeout_s``."""

    def __init__(
        self, env: dict[str, str], log_path: str | Path, start_timeout_s: float = 600.0, stop_timeout_s: float = 30.0
    ) -> None:
        self.env = env
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.startup_s: float | None = None
        self.stages: list[dict[str, Any]] = []
        self.tail: deque[str] = deque(maxlen=40)
        self._listening = threading.Event()
        self._t0 = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "hypic_agent.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        threading.Thread(target=self._read, name="serve-log", daemon=True).start()
        try:
            deadline = self._t0 + self.start_timeout_s
            while not self._listening.wait(0.1):
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the server exited ({self.proc.returncode}) before listening; its last lines:\n"
                        + "\n".join(self.tail)
                    )
                if time.perf_counter() > deadline:
                    raise RuntimeError(
                        f"the server did not listen within {self.start_timeout_s:g} s; see {self.log_path}"
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log_path.open("w") as log:
            for raw in self.proc.stdout:  # ends when the process has exited (EOF)
                t_s = round(time.perf_counter() - self._t0, 3)
                line = raw.decode(errors="replace").rstrip("\n")
                log.write(line + "\n")
                log.flush()
                self.tail.append(line)
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict):
                    continue
                msg = str(rec.get("msg", ""))
                if rec.get("logger") == "hypic.startup" and not msg.startswith("still "):
                    self.stages.append({"msg": msg, "elapsed_s": rec.get("elapsed_s"), "t_s": t_s})
                if msg == "listening" and self.port is None:
                    self.port, self.startup_s = int(rec["port"]), t_s
                    self.stages.append({"msg": "listening", "t_s": t_s})
                    self._listening.set()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(self.stop_timeout_s)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
