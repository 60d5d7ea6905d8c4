"""The disk tier of the entry store: one safetensors file per entry under the store dir.

A payload is an opaque ``dict[str, Tensor]`` (the runtime decides what is in it). Each file is
written to a temp file, fsynced and atomically renamed, so a crash leaves either the whole file
or a ``*.tmp`` that recovery removes. The tier does no locking: ``SegmentStore`` serializes every
call that changes it.

A file describes itself: its safetensors metadata holds the entry's key, tenant, kind, model
fingerprint and token digest, and (since header version 1 of ``headers.py``) its whole registry
row as JSON under ``row`` with ``row_xxh3``, plus ``data_xxh3`` over the tensor bytes, so a lost
or damaged registry is rebuilt from the files (``inspect``). Files written before that lack the
three keys and still load (their token ids come from the payload's ``token_ids`` tensor). Files
that cannot be read are moved into ``<root>/quarantine/`` (``quarantine``), never deleted.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import xxhash

from hypic_agent.segments.store.integrity import QUARANTINE_DIR, stamp

Tensors = dict[str, torch.Tensor]
FILE_FORMAT = "hypic-entry-1"
_SUFFIX = ".safetensors"
_TMP = ".tmp"
_QUARANTINED = ".quarantined"
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class CorruptEntryError(Exception):
    """A disk entry whose bytes or metadata do not check out (never served)."""


@dataclass(frozen=True)
class DiskWrite:
    location: str  # relative to the disk tier root
    checksum: str  # xxh3_128 hex of the file bytes
    file_bytes: int


@dataclass(frozen=True)
class FileHeader:
    """What a payload file says about itself (``DiskTier.inspect``), checked against its bytes."""

    location: str
    metadata: dict[str, str]
    checksum: str  # xxh3_128 of the file bytes (what a registry row records)
    file_bytes: int
    nbytes: int  # tensor bytes (the entry's payload size)
    mtime: float
    verified: bool  # row_xxh3 / data_xxh3 present and matching (False: a file from before them)
    token_ids: tuple[int, ...] | None  # the payload's own int32 ``token_ids`` tensor, if it has one


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
        """Serialize, write ``*.tmp``, fsync, rename into place, fsync the folder. The header gets
        ``data_xxh3`` (the tensor bytes) and, when ``metadata`` has a ``row``, ``row_xxh3``."""
        cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
        md = {"format": FILE_FORMAT, **metadata}
        if "row" in md:
            md["row_xxh3"] = checksum_bytes(md["row"].encode())
        prefix, head, body = _with_data_checksum(safetensors.torch.save(cpu, metadata=md))
        location = f"{key[:2]}/{key}.{uuid.uuid4().hex[:12]}{_SUFFIX}"
        final = self.path(location)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(final.name + _TMP)
        digest = xxhash.xxh3_128()
        with open(tmp, "wb") as f:
            for part in (prefix, head, body):
                f.write(part)
                digest.update(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        return DiskWrite(location=location, checksum=digest.hexdigest(), file_bytes=len(prefix) + len(head) + len(body))

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

    def inspect(self, location: str) -> FileHeader:
        """Read one file and check that its header describes its bytes (for a rebuild of its row);
        raises ``CorruptEntryError`` for a cut, damaged or foreign file."""
        path = self.path(location)
        try:
            data = path.read_bytes()
            mtime = path.stat().st_mtime
        except OSError as exc:
            raise CorruptEntryError(f"cannot read {location}: {exc}") from exc
        try:
            header, start = _parse_header(data)
        except (ValueError, struct.error) as exc:
            raise CorruptEntryError(f"{location}: unreadable safetensors header: {exc}") from exc
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise CorruptEntryError(f"{location}: metadata is not a string map")
        if meta.get("format") != FILE_FORMAT:
            raise CorruptEntryError(f"{location} is not a {FILE_FORMAT} file")
        nbytes, token_ids = _check_tensors(header, data, start, location)
        verified = "data_xxh3" in meta and "row_xxh3" in meta
        if "data_xxh3" in meta and checksum_bytes(memoryview(data)[start:]) != meta["data_xxh3"]:
            raise CorruptEntryError(f"{location}: tensor bytes do not match data_xxh3")
        if "row_xxh3" in meta and checksum_bytes(meta.get("row", "").encode()) != meta["row_xxh3"]:
            raise CorruptEntryError(f"{location}: row header does not match row_xxh3")
        return FileHeader(
            location=location, metadata=meta, checksum=checksum_bytes(data), file_bytes=len(data),
            nbytes=nbytes, mtime=mtime, verified=verified, token_ids=token_ids,
        )  # fmt: skip

    # ------------------------------------------------------------------ housekeeping
    def remove(self, location: str | None) -> None:
        if location:
            self.path(location).unlink(missing_ok=True)

    @property
    def quarantine_dir(self) -> Path:
        return self.root / QUARANTINE_DIR

    def quarantine(self, location: str) -> Path | None:
        """Move a file that cannot be served or rebuilt into ``<root>/quarantine/`` (kept for a
        person to look at, never deleted); returns where it went (``None``: it was not there)."""
        src = self.path(location)
        if not src.exists():
            return None
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        dst = self.quarantine_dir / f"{src.name}.{stamp()}{_QUARANTINED}"
        try:
            os.replace(src, dst)
        except OSError:
            return None
        return dst

    def scan(self) -> tuple[dict[str, int], list[Path]]:
        """(``{location: file bytes}`` of complete files, leftover temp files)."""
        files: dict[str, int] = {}
        temps: list[Path] = []
        for p in self.root.rglob("*"):
            if not p.is_file() or p.relative_to(self.root).parts[0] == QUARANTINE_DIR:
                continue
            if p.name.endswith(_TMP):
                temps.append(p)
            elif p.name.endswith(_SUFFIX):
                files[p.relative_to(self.root).as_posix()] = p.stat().st_size
        return files, temps


def checksum_bytes(data: bytes | memoryview) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def _with_data_checksum(data: bytes) -> tuple[bytes, bytes, memoryview]:
    """A serialized safetensors blob as (length prefix, header, tensor bytes), its header given
    ``data_xxh3`` of the tensor bytes (padded with spaces to 8 bytes, as safetensors does)."""
    header, start = _parse_header(data)
    body = memoryview(data)[start:]
    meta = header.get("__metadata__")
    header["__metadata__"] = {**(meta if isinstance(meta, dict) else {}), "data_xxh3": checksum_bytes(body)}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)), head, body


def _parse_header(data: bytes) -> tuple[dict[str, object], int]:
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"header of {n} bytes in a file of {len(data)}")
    header = json.loads(data[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    return header, 8 + n


def _check_tensors(
    header: Mapping[str, object], data: bytes, start: int, location: str
) -> tuple[int, tuple[int, ...] | None]:
    """(tensor bytes, the ``token_ids`` tensor's values) after checking that the tensors' offsets
    exactly cover the file's data section."""
    end = 0
    nbytes = 0
    token_ids: tuple[int, ...] | None = None
    for name, info in header.items():
        try:
            assert isinstance(info, dict)
            lo, hi = (int(x) for x in info["data_offsets"])
            dtype = str(info["dtype"])
            count = int(np.prod([int(d) for d in info["shape"]], dtype=np.int64))
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            raise CorruptEntryError(f"{location}: bad tensor entry {name!r}") from exc
        if not 0 <= lo <= hi or (dtype in _DTYPE_BYTES and hi - lo != count * _DTYPE_BYTES[dtype]):
            raise CorruptEntryError(f"{location}: tensor {name!r} has bad offsets")
        end = max(end, hi)
        nbytes += hi - lo
        if name == "token_ids" and dtype == "I32" and start + hi <= len(data):
            token_ids = tuple(int(t) for t in np.frombuffer(data, dtype="<i4", count=count, offset=start + lo))
    if start + end != len(data):
        raise CorruptEntryError(f"{location}: {len(data)} bytes, its header describes {start + end}")
    return nbytes, token_ids


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
