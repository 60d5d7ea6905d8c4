"""Which device each scatter worker runs on, checked at start-up (a bad list is an error, not a hang)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DeviceError(ValueError):
    """The scatter devices do not fit the machine or the worker count."""


def comm_device(device: torch.device) -> torch.device:
    """Where a pair group's tensors live: the GPU for NCCL, the host for gloo."""
    return device if device.type == "cuda" else torch.device("cpu")


def worker_devices(workers: int, devices: Sequence[str], home: torch.device) -> list[str]:
    """One device per worker. ``devices`` empty: on CPU every worker on the CPU; on CUDA one GPU per
    worker, in order, skipping rank 0's own. Given: one per worker (a shorter list is repeated on CPU only).
    Raises ``DeviceError`` for a device that does not exist, more workers than CUDA devices, or a
    mix of CPU and CUDA (gloo and NCCL do not talk to each other)."""
    if workers < 1:
        raise DeviceError("scatter_workers must be at least 1")
    names = [d.strip() for d in devices if d.strip()]
    if not names:
        if home.type == "cuda":  # every GPU but rank 0's (NCCL pairs two processes on two GPUs)
            names = [f"cuda:{i}" for i in range(torch.cuda.device_count()) if i != (home.index or 0)][:workers]
        else:
            names = ["cpu"]
    parsed: list[torch.device] = []
    for n in names:
        try:
            parsed.append(torch.device(n))
        except RuntimeError as e:
            raise DeviceError(f"scatter device {n!r} is not a device name ({e})") from None
    kinds = {d.type for d in parsed} | {home.type}
    if not kinds <= {"cpu", "cuda"} or len(kinds) > 1:
        raise DeviceError(f"scatter devices {names} must all be of rank 0's kind ({home.type}), cpu or cuda")
    if home.type == "cuda":
        count = torch.cuda.device_count()
        for d in parsed:
            if (d.index or 0) >= count:
                raise DeviceError(f"scatter device {d} does not exist ({count} CUDA devices visible)")
            if (d.index or 0) == (home.index or 0):
                raise DeviceError(f"scatter device {d} is rank 0's own GPU (NCCL pairs processes on different GPUs)")
        if len(parsed) < workers:
            raise DeviceError(f"{workers} scatter workers need {workers} CUDA devices, {len(parsed)} given: {names}")
        return [str(d) for d in parsed[:workers]]
    return [str(parsed[i % len(parsed)]) for i in range(workers)]
