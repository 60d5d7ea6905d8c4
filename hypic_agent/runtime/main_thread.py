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

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def off_main_thread(fn: Callable[[], T], name: str = "hypic-startup") -> T:
    """``fn()`` on a fresh thread that has exited (its OpenMP pool with it) once this returns what it
    returned or raises what it raised."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as one:  # the exit joins the thread
        return one.submit(fn).result()
