"""Storage tiers of the entry store: memory pools (GPU, CPU) and the disk folder.

A payload is an opaque ``dict[str, Tensor]`` (the runtime decides what is in it). Memory
tiers hold the tensors themselves on their device; the disk tier holds one safetensors file
per entry, written to a temp file, fsynced and atomically renamed, so a crash leaves either
the whole file or a ``*.tmp`` that recovery removes. Tiers do no locking: ``SegmentStore``
serializes every call that changes them.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import xxhash

Tensors = dict[str, torch.Tensor]
FILE_FORMAT = "hypic-entry-1"
_SUFFIX = ".safetensors"
_TMP = ".tmp"


class CorruptEntryError(Exception):
    """A disk entry whose bytes or metadata do not check out (never served)."""


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


@dataclass(frozen=True)
class DiskWrite:
    location: str  # relative to the disk tier root
    checksum: str  # xxh3_128 hex of the file bytes
    file_bytes: int


class DiskTier:
    """One safetensors file per entry under ``root`` (``<key[:2]>/<key>.<nonce>.safetensors``).

    Each write gets a fresh nonce in its file name, so rewriting a key never clobbers a file
    another reader or writer still refers to; the registry row names the current file.
    """

    name = "disk"

    def __init__(self, root: Path | str, budget_bytes: int) -> None:
        self.root = Path(root)
        self.budget = int(budget_bytes)
        self.used = 0
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def fits(self, nbytes: int) -> bool:
        return self.enabled and nbytes <= self.budget

    def path(self, location: str) -> Path:
        return self.root / location

    # ------------------------------------------------------------------ write
    def write(self, key: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> DiskWrite:
        """Serialize, write ``*.tmp``, fsync, rename into place, fsync the folder."""
        cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
        data = safetensors.torch.save(cpu, metadata={"format": FILE_FORMAT, **metadata})
        location = f"{key[:2]}/{key}.{uuid.uuid4().hex[:12]}{_SUFFIX}"
        final = self.path(location)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(final.name + _TMP)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        return DiskWrite(location=location, checksum=checksum_bytes(data), file_bytes=len(data))

    # ------------------------------------------------------------------ read
    def read(self, location: str, checksum: str | None) -> tuple[Tensors, dict[str, str]]:
        """Load and verify one file; raises ``CorruptEntryError`` (also for a missing file)."""
        try:
            data = self.path(location).read_bytes()
        except OSError as exc:
            raise CorruptEntryError(f"cannot read {location}: {exc}") from exc
        if checksum is None or checksum_bytes(data) != checksum:
            raise CorruptEntryError(f"checksum mismatch for {location}")
        try:
            metadata = read_metadata(data)
            tensors = safetensors.torch.load(data)
        except Exception as exc:
            raise CorruptEntryError(f"unreadable safetensors file {location}: {exc}") from exc
        if metadata.get("format") != FILE_FORMAT:
            raise CorruptEntryError(f"{location} is not a {FILE_FORMAT} file")
        return tensors, metadata

    # ------------------------------------------------------------------ housekeeping
    def remove(self, location: str | None) -> None:
        if location:
            self.path(location).unlink(missing_ok=True)

    def scan(self) -> tuple[dict[str, int], list[Path]]:
        """(``{location: file bytes}`` of complete files, leftover temp files)."""
        files: dict[str, int] = {}
        temps: list[Path] = []
        for p in self.root.rglob("*"):
            if not p.is_file():
                continue
            if p.name.endswith(_TMP):
                temps.append(p)
            elif p.name.endswith(_SUFFIX):
                files[p.relative_to(self.root).as_posix()] = p.stat().st_size
        return files, temps


def checksum_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def read_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a serialized safetensors blob."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return dict(header.get("__metadata__") or {})


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
