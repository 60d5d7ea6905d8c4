"""The scheduler's host cost per decode step: what a step costs beyond the model's forward.

``batch`` requests (``full_recompute``, ``--prompt`` tokens each, greedy, ``ignore_eos``) decode
together on a small model, so the host work (planning the step, sampling, reading the tokens back,
stop checks, detokenization, streaming the events) is a large share of each step. The benchmark
drives ``Scheduler.step()`` itself (no engine thread) and times each decode step and, inside it,
``ModelRunner.forward``; host time = step - forward, per step and per request (medians over the
timed steps). Meant for the CPU, where the forward is synchronous and a tiny model's forward is
short; on CUDA the forward only launches work and overlap hides the host work behind the device
(``serving.py`` measures that). ``wakeups_per_step``: how often the event loop was woken per step
(``--sink loop``); ``events``: the events the consumers received (every token and the finish).

* ``--sink loop`` (default): each request's events go through the API's delivery to an event loop
  (``api.job_stream.LoopInbox``, as ``JobStream`` submits them) running on its own thread, where
  one task per request awaits them (as ``JobStream.next`` does). ``--sink list``: the sink appends
  to a list (the scheduler alone).
* ``--tokenizer tiny``: the byte-level test tokenizer (one byte per token); ``shipped``: the shipped
  model's BPE tokenizer (``hypic_agent/weights/smollm2-135m-hybrid``, 49,152 ids) with the model's
  vocabulary widened to it, so every step detokenizes real multi-character tokens (on the CPU the
  argmax over the wider logits then counts as host time too: ``sample_ms``, the step's sampling
  launch, which on CUDA is device work, shows how much).
* ``--paged`` (default): decode plans as on CUDA (paged attention through the block table; the
  torch twin runs on the CPU); ``--no-paged``: the CPU plans (per-key gather rows).
* ``--stop``: give every request a stop string that never matches (the stop checks run).

    python benchmarks/host_overhead.py
    python benchmarks/host_overhead.py --tokenizer shipped --batches 64 --steps 64
    python benchmarks/host_overhead.py --profile bench_out/host_overhead.prof --batches 64
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
from _common import ROOT, load_shape, model_args, print_table, random_model, write_json
from ttft import Plan, Seg  # the prompt shapes ttft.py and qps.py use

from hypic_agent.api.job_stream import LoopInbox
from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer, tiny_tokenizer
from hypic_agent.runtime.runner.runner import ModelRunner
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.runtime.scheduler import scheduler as scheduler_module
from hypic_agent.runtime.scheduler.request import END, GenerationRequest
from hypic_agent.runtime.serving import Serving

SHIPPED = ROOT / "hypic_agent" / "weights" / "smollm2-135m-hybrid"


class PagedRunner(ModelRunner):
    """The runner with CUDA's decode plans on any device (``--paged``)."""

    @property
    def paged_decode(self) -> bool:
        return True


class LoopConsumers:
    """An event loop on its own thread; one task per request awaits its events as ``JobStream.next``
    does. ``sink(i)`` is request i's sink, delivering through the API's ``LoopInbox``."""

    def __init__(self, n: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-loop", daemon=True)
        self.thread.start()
        self.events = [0] * n
        self.queues, self.inbox = asyncio.run_coroutine_threadsafe(self._setup(n), self.loop).result()
        self.done = [asyncio.run_coroutine_threadsafe(self._consume(i), self.loop) for i in range(n)]

    @staticmethod
    async def _setup(n: int) -> tuple[list[asyncio.Queue[tuple[Any, float]]], LoopInbox]:
        return [asyncio.Queue() for _ in range(n)], LoopInbox.of(asyncio.get_running_loop())

    async def _consume(self, i: int) -> None:
        while True:
            item, _stamp = await self.queues[i].get()
            if item is END or isinstance(item, BaseException):
                return
            self.events[i] += 1

    def sink(self, i: int) -> Any:
        q = self.queues[i]

        def deliver(item: Any) -> None:
            self.inbox.post(q.put_nowait, (item, time.perf_counter()))

        return deliver

    def close(self) -> None:
        for f in self.done:
            f.result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def measure(serving: Serving, batch: int, args: argparse.Namespace, prof: cProfile.Profile | None) -> dict[str, Any]:
    sched = serving.scheduler
    runner = serving.runner
    forward = type(runner).forward
    fwd = [0.0]

    def timed_forward(plan: Any) -> torch.Tensor:
        t0 = time.perf_counter()
        out = forward(runner, plan)
        fwd[0] += time.perf_counter() - t0
        return out

    runner.forward = timed_forward  # type: ignore[method-assign]
    sample = scheduler_module.sample_on_device
    sampling_s = [0.0]

    def timed_sample(*a: Any) -> Any:
        t0 = time.perf_counter()
        out = sample(*a)
        sampling_s[0] += time.perf_counter() - t0
        return out

    scheduler_module.sample_on_device = timed_sample  # type: ignore[assignment]
    consumers = LoopConsumers(batch) if args.sink == "loop" else None
    lists: list[list[Any]] = [[] for _ in range(batch)]
    g = torch.Generator().manual_seed(batch)
    vocab = serving.engine.model.config.vocab_size
    stop = ("\x00never\x00",) if args.stop else ()
    sampling = SamplingParams(max_tokens=args.steps + args.warmup + 1, ignore_eos=True, stop=stop)
    with serving.engine.lock:
        for i in range(batch):
            prompt = Plan([Seg(tuple(torch.randint(0, min(vocab, 256), (args.prompt,), generator=g).tolist()))], [])
            req = GenerationRequest(prompt, sampling, "full_recompute")
            sched.submit(req, consumers.sink(i) if consumers is not None else lists[i].append)
    while len(sched.live) < batch or not all(r.decoding for r in sched.live):  # admission and prefill
        sched.step()
    for _ in range(args.warmup):
        sched.step()
    steps: list[float] = []
    host: list[float] = []
    samples: list[float] = []
    wakeups = consumers.inbox.wakeups if consumers is not None else 0
    if prof is not None:
        prof.enable()
    for _ in range(args.steps):
        fwd[0] = sampling_s[0] = 0.0
        t0 = time.perf_counter()
        sched.step()
        wall = time.perf_counter() - t0
        steps.append(wall * 1e3)
        host.append((wall - fwd[0]) * 1e3)
        samples.append(sampling_s[0] * 1e3)
    if prof is not None:
        prof.disable()
    wakeups = consumers.inbox.wakeups - wakeups if consumers is not None else 0
    while sched.live or sched._inflight is not None:  # the rest, to the finish events
        sched.step()
    if consumers is not None:
        consumers.close()
        events = sum(consumers.events)
    else:
        events = sum(1 for lst in lists for e in lst if e is not END)
    del runner.forward
    scheduler_module.sample_on_device = sample  # type: ignore[assignment]
    host_ms = statistics.median(host)
    return {
        "batch": batch,
        "steps": args.steps,
        "step_ms": statistics.median(steps),
        "forward_ms": statistics.median(s - h for s, h in zip(steps, host, strict=True)),
        "host_ms": host_ms,
        "host_us_per_req": host_ms * 1e3 / batch,
        "sample_ms": statistics.median(samples),
        "wakeups_per_step": wakeups / args.steps,  # the event loop's wake-ups (--sink loop)
        "events": events,
    }


def main() -> None:
    ap = model_args(argparse.ArgumentParser(description=__doc__))
    ap.set_defaults(shape="tiny:qwen3_5_text", device="cpu", dtype="float32")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=48, help="timed decode steps per batch")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--tokenizer", choices=["tiny", "shipped"], default="tiny")
    ap.add_argument("--sink", choices=["loop", "list"], default="loop")
    ap.add_argument("--paged", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--stop", action="store_true", help="a stop string per request (never matches)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--profile", default="", help="cProfile the timed steps of the largest batch into this file")
    ap.add_argument("--out", default="bench_out/host_overhead.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    raw = load_shape(args.shape, args.layers)
    tok = tiny_tokenizer() if args.tokenizer == "tiny" else load_tokenizer(SHIPPED)
    if args.tokenizer == "shipped":
        raw.get("text_config", raw)["vocab_size"] = len(tok)
    model = random_model(raw, args.device, getattr(torch, args.dtype))
    rows: list[dict[str, Any]] = []
    for batch in args.batches:
        settings = Settings(
            device=args.device,
            max_running=batch,
            max_waiting=max(1024, batch),
            kv_page_size=args.page_size,
            kv_pool_tokens=batch * (args.prompt + args.steps + args.warmup + 2 * args.page_size),
            prefill_chunk_tokens=max(512, batch * args.prompt),
            overlap_schedule=args.overlap,
            cuda_graphs=False,
        )
        engine = Engine(model, tok, "host-overhead", settings)
        if args.paged:
            engine.runner.__class__ = PagedRunner
        serving = Serving.of(engine)
        serving.scheduler.start = lambda: None  # type: ignore[method-assign]  # step() is driven here
        prof = cProfile.Profile() if args.profile and batch == max(args.batches) else None
        row = measure(serving, batch, args, prof)
        rows.append(row)
        print(
            f"batch {batch}: step {row['step_ms']:.2f} ms, forward {row['forward_ms']:.2f} ms, "
            f"host {row['host_ms']:.2f} ms = {row['host_us_per_req']:.1f} us/request",
            flush=True,
        )
        if prof is not None:
            Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
            prof.dump_stats(args.profile)
            print(f"wrote {args.profile}")
        serving.close()
    print_table(
        rows,
        ["batch", "step_ms", "forward_ms", "host_ms", "host_us_per_req", "sample_ms", "wakeups_per_step", "events"],
    )
    write_json(args.out, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
