"""``off_main_thread``: run start-up torch work on a short-lived thread, so the engine thread serves
at full speed on the CPU.

GNU OpenMP (the CPU build of torch) keeps one thread pool per host thread that ran a parallel op,
until that thread exits; and once the pools together hold more threads than there are CPUs, every
pool stops spinning between parallel regions and wakes its workers through the kernel each time.
The main thread never exits: a model loaded on it leaves a pool behind, and from then on every
parallel op of the engine thread (``scheduler.Scheduler``) pays that wake-up. Measured on 2 CPU
cores (torch 2.13): a 64x256 @ 256x256 matmul 32 us on a thread alone, 97 us with the main
thread's pool alive; a composed prepare of the tiny model 32 ms vs 106 ms. Loading on a thread that
then exits leaves no pool, so the engine thread's is the only one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def off_main_thread(fn: Callable[[], T], name: str = "hypic-startup") -> T:
    """``fn()`` on a fresh thread that exits when it returns (its OpenMP pool with it); returns what it
    returned or raises what it raised. KeyboardInterrupt still reaches the caller's join."""
    out: list[T] = []
    err: list[BaseException] = []

    def body() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            err.append(exc)

    th = threading.Thread(target=body, name=name, daemon=True)
    th.start()
    while th.is_alive():
        th.join(0.2)  # in slices: Ctrl-C during a long load interrupts the caller
    if err:
        raise err[0]
    return out[0]
