"""Memory tiers of the entry store: byte-budgeted pools of payloads on one device (GPU or CPU).

A payload is an opaque ``dict[str, Tensor]`` (the runtime decides what is in it); a memory tier
holds the tensors themselves on its device. Tiers do no locking: ``SegmentStore`` serializes
every call that changes them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

Tensors = dict[str, torch.Tensor]


def payload_nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class MemoryTier:
    """A byte-budgeted pool of payloads on one device (``cuda``: the GPU pool; ``cpu``: host,
    pinned when ``pin`` so promotion to the GPU is an async copy)."""

    def __init__(self, name: str, device: torch.device | str, budget_bytes: int, *, pin: bool = False) -> None:
        self.name = name
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.budget = int(budget_bytes)
        self.pin = pin and self.device.type == "cpu"
        self.used = 0
        self._items: dict[str, tuple[Tensors, int]] = {}

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def fits(self, nbytes: int) -> bool:
        return self.enabled and nbytes <= self.budget

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> Tensors | None:
        item = self._items.get(key)
        return None if item is None else item[0]

    def put(self, key: str, tensors: Mapping[str, torch.Tensor]) -> Tensors:
        """Place a payload here (copying it to this device when needed); returns the held tensors."""
        self.pop(key)
        held = {name: self._to_device(t) for name, t in tensors.items()}
        nbytes = payload_nbytes(held)
        self._items[key] = (held, nbytes)
        self.used += nbytes
        return held

    def pop(self, key: str) -> Tensors | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.used -= item[1]
        return item[0]

    def held_keys(self) -> list[str]:
        return list(self._items)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.device != self.device:
            if self.pin:
                out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                out.copy_(t)
                return out
            return t.to(self.device, non_blocking=t.is_pinned())
        return t
