"""One scatter worker as rank 0 holds it: its process, its pair group, its start-up and its end.

``WorkerHandle.start`` spawns the process (``worker.worker_main``), waits for its model load (up to
``Launch.start_timeout_s``, while the process lives), joins its pair group under a fresh prefix of
the pool's ``TCPStore`` and checks its ``READY`` fingerprint against rank 0's; any failure comes
back as the reason, the process killed and reaped. ``kill`` ends the process and its group.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hypic_agent.runtime.workers import protocol as wire
from hypic_agent.runtime.workers.channel import Channel, PairGroup, pair_group
from hypic_agent.runtime.workers.devices import comm_device
from hypic_agent.runtime.workers.worker import LOADED, WorkerSpec, worker_main

log = logging.getLogger("hypic.workers")


@dataclass(frozen=True)
class Launch:
    """What every worker of a pool is started with (the model, the rendezvous, the timeouts)."""

    ctx: Any  # a torch.multiprocessing spawn context
    store: dist.TCPStore
    settings_json: str
    model: str | None
    fingerprint: str
    home: torch.device
    timeout_s: float
    start_timeout_s: float
    delay_s: float = 0.0
    group_delay_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)  # set when the pool closes: starts give up


class WorkerHandle:
    def __init__(self, index: int, device: str) -> None:
        self.index = index
        self.device = device
        self.gen = 0
        self.proc: Any = None
        self.chan: Channel | None = None
        self.alive = False
        self.lock = threading.Lock()  # one job (or restart) at a time

    def start(self, launch: Launch) -> str | None:
        """Spawn the process and wait for its ``READY`` -> None, or the reason it failed."""
        self.gen += 1
        prefix = f"w{self.index}g{self.gen}/"
        spec = WorkerSpec(
            "127.0.0.1",
            launch.store.port,
            prefix,
            self.device,
            launch.settings_json,
            launch.model,
            launch.timeout_s,
            launch.delay_s,
            launch.group_delay_s,
        )
        self.proc = launch.ctx.Process(
            target=worker_main, args=(spec,), daemon=True, name=f"hypic-scatter-{self.index}"
        )
        self.proc.start()
        dev = comm_device(launch.home)
        try:
            self._wait_loaded(launch, prefix)
            self.chan = Channel(self._join(launch, prefix, dev), 0, dev)
            hdr = self.chan.recv_ints(wire.HEADER)
            text = wire.body_text(self.chan.recv_ints(int(hdr[4])))
        except Exception as e:  # the worker died before joining, or never answered
            self.kill()
            return f"worker {self.index} on {self.device} did not join (exit code {self.proc.exitcode}): {e}"
        if int(hdr[0]) == wire.ERROR:
            self.kill()
            return f"worker {self.index} on {self.device}: {text}"
        if text != launch.fingerprint:
            self.kill()
            return f"worker {self.index} loaded model {text!r}, rank 0 has {launch.fingerprint!r}"
        self.alive = True
        log.info("scatter worker %d ready on %s (pid %s)", self.index, self.device, self.proc.pid)
        return None

    def _wait_loaded(self, launch: Launch, prefix: str) -> None:
        """Wait (up to ``start_timeout_s``, while the process lives) until the worker has loaded its
        model: a start-up takes as long as a model load, which the job timeout must not bound."""
        deadline = time.monotonic() + launch.start_timeout_s
        while not launch.store.check([prefix + LOADED]):
            if not self.proc.is_alive():
                raise RuntimeError("the process exited")
            if launch.stop.is_set():
                raise RuntimeError("the pool is closing")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no model loaded within {launch.start_timeout_s:.0f} s")
            time.sleep(0.05)

    def _join(self, launch: Launch, prefix: str, dev: torch.device) -> PairGroup:
        """Rank 0's side of the pair group, given up at once if the process exits first."""
        box: list[Any] = []

        def join() -> None:
            try:
                box.append(pair_group(launch.store, prefix, 0, dev, launch.timeout_s))
            except Exception as e:  # handed to the caller
                box.append(e)

        t = threading.Thread(target=join, daemon=True, name=f"scatter-join-{self.index}")
        t.start()
        deadline = time.monotonic() + launch.timeout_s
        while t.is_alive() and self.proc.is_alive() and not launch.stop.is_set() and time.monotonic() < deadline:
            t.join(0.05)
        if not box:
            if launch.stop.is_set():
                raise RuntimeError("the pool is closing")
            raise RuntimeError("the process exited" if not self.proc.is_alive() else "no rendezvous in time")
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]  # type: ignore[no-any-return]

    def exited(self) -> str | None:
        """How the process ended (``"exit code 1"``, ``"killed by signal 9"``), or None while it runs."""
        if self.proc is None or self.proc.is_alive():
            return None
        code = self.proc.exitcode
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"

    def kill(self) -> None:
        self.alive = False
        if self.chan is not None:
            self.chan.close()
            self.chan = None
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=10)
