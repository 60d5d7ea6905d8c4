"""A scatter worker process: join rank 0's pair group, load the model replica, build entries on demand.

The worker loads the same model as rank 0 from the same ``Settings`` (and model spec) onto its own
device, answers ``READY`` with the model's fingerprint (rank 0 checks it matches its own) or
``ERROR`` with the reason, then serves build jobs until ``STOP``: each job is one packed varlen
batch (``stream.build_streamed``), whose entries go back layer group by layer group as the
batch's layers are built, as int64 headers plus raw tensors (``protocol``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch

from hypic_agent.config import Settings
from hypic_agent.runtime.model_loader import load_model
from hypic_agent.runtime.workers import protocol as wire
from hypic_agent.runtime.workers.channel import Channel, pair_group
from hypic_agent.runtime.workers.stream import Streamer, build_streamed

if TYPE_CHECKING:
    from hypic_agent.runtime.models.hybrid import HybridForCausalLM

log = logging.getLogger("hypic.worker")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process needs to join and serve: the rendezvous (``host``/``port`` of rank 0's
    ``TCPStore`` and this worker's group ``prefix``), its device, and the model to load.
    ``delay_s``: a pause before each job, ``group_delay_s`` after each layer group sent (fault
    injection: lets a test kill a worker mid-build or mid-stream)."""

    host: str
    port: int
    prefix: str
    device: str
    settings_json: str
    model: str | None
    timeout_s: float
    delay_s: float = 0.0
    group_delay_s: float = 0.0


LOADED = "loaded"  # store key (under the worker's prefix): its model load is over, successful or not


def worker_main(spec: WorkerSpec) -> None:
    """The worker process's entry point (``torch.multiprocessing`` spawn target)."""
    torch.set_num_threads(1)  # workers share the host with rank 0 and each other
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops rank 0, whose shutdown stops the workers
    import torch.distributed as dist

    device = torch.device(spec.device)
    store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=_td(spec.timeout_s))
    failure: Exception | None = None
    try:  # the model loads before the pair group exists: the group's timeout is the job timeout
        settings = Settings.model_validate_json(spec.settings_json)
        model, _, fingerprint = load_model(settings, model=spec.model, device=device)
        model.eval()
    except Exception as e:  # reported to rank 0, which raises it at start-up
        failure = e
    store.set(spec.prefix + LOADED, "1")  # rank 0 joins the pair group once this is there
    chan = Channel(pair_group(store, spec.prefix, 1, device, spec.timeout_s), 1, device)
    if failure is not None:
        msg = wire.text_body(f"{type(failure).__name__}: {failure}")
        chan.send(wire.header(wire.ERROR, 0, 0, 0, msg.numel()))
        chan.send(msg)
        chan.close()
        return
    fp = wire.text_body(fingerprint)
    chan.send(wire.header(wire.READY, os.getpid(), 0, 0, fp.numel()))
    chan.send(fp)
    serve(chan, model, spec.delay_s, spec.group_delay_s)
    chan.close()


def serve(chan: Channel, model: HybridForCausalLM, delay_s: float = 0.0, group_delay_s: float = 0.0) -> None:
    """Answer build jobs until ``STOP`` (or until rank 0 is gone)."""
    n_layers = len(model.layers)
    while True:
        try:
            hdr = chan.recv_ints(wire.HEADER)
        except Exception:  # rank 0 went away: nothing left to serve
            return
        if int(hdr[0]) == wire.STOP:
            return
        job = wire.Job.decode(hdr, chan.recv_ints(wire.Job.body_len(hdr)))
        if delay_s:
            time.sleep(delay_s)
        out = Streamer(chan, job.job, group_delay_s)
        groups = wire.layer_groups(n_layers, job.stream_layers)
        t0 = time.perf_counter()
        entries = build_streamed(
            model, job.segments, job.seams, groups, out.layers, pair_dtype=job.pair_dtype, prefix=job.prefix
        )
        if chan.device.type == "cuda":  # pragma: no cover - no GPU in CI
            torch.cuda.synchronize(chan.device)
        out.finish(len(entries), int((time.perf_counter() - t0) * 1e6))


def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
