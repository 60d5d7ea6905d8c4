"""Content keys of segments: position-independent, tenant-salted, model-bound.

``SegmentKey = xxh3_128(FORMAT_VERSION, model fingerprint, tenant namespace, seam, token ids)``
as 32 lowercase hex digits. There is no parent hash: the same tokens give the same key
wherever the segment sits in a prompt, which is what makes reuse position-independent.

NOTE: every field is length-prefixed before hashing so no two field tuples share a byte
string; token ids are hashed as little-endian int32. Python's ``hash()`` (salted per process)
never appears here.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np
import xxhash

from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.framing import FORMAT_VERSION

SegmentKey = NewType("SegmentKey", str)
"""32 lowercase hex digits (xxh3_128)."""

_KEY_DOMAIN = b"hypic-segment-key"
_DIGEST_DOMAIN = b"hypic-token-digest"
_INT32_MAX = 2**31 - 1


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids ``[n]`` as little-endian int32 bytes ``[4n]``."""
    arr = np.asarray(token_ids, dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidRequestError("token ids must be a flat sequence of ints", param="token_ids")
    if arr.size and (arr.min() < 0 or arr.max() > _INT32_MAX):
        raise InvalidRequestError("token ids must lie in [0, 2**31)", param="token_ids")
    return arr.astype("<i4").tobytes()


def tokens_from_bytes(data: bytes) -> tuple[int, ...]:
    """Inverse of ``token_bytes``."""
    return tuple(int(t) for t in np.frombuffer(data, dtype="<i4"))


def seam_repr(seam: float) -> str:
    """Canonical text of a seam setting: ``8`` and ``8.0`` are the same setting."""
    seam = float(seam)
    if seam < 0:
        raise InvalidRequestError(f"seam must be >= 0, got {seam}", param="seam")
    return str(int(seam)) if seam.is_integer() else repr(seam)


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def segment_key(
    token_ids: Sequence[int],
    *,
    model_fingerprint: str,
    tenant: str,
    seam: float,
    format_version: int = FORMAT_VERSION,
) -> SegmentKey:
    """Key of one canonical segment (see module doc)."""
    h = xxhash.xxh3_128()
    h.update(_field(_KEY_DOMAIN))
    h.update(_field(str(int(format_version)).encode()))
    h.update(_field(model_fingerprint.encode()))
    h.update(_field(tenant.encode()))
    h.update(_field(seam_repr(seam).encode()))
    h.update(_field(token_bytes(token_ids)))
    return SegmentKey(h.hexdigest())


def token_digest(token_ids: Sequence[int]) -> str:
    """Digest of the tokens alone (32 hex), stored with an entry and re-checked on a hit."""
    h = xxhash.xxh3_128()
    h.update(_field(_DIGEST_DOMAIN))
    h.update(_field(token_bytes(token_ids)))
    return h.hexdigest()


def is_key(value: str) -> bool:
    """Whether ``value`` looks like a ``SegmentKey`` (32 lowercase hex digits)."""
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


@dataclass(frozen=True)
class KeyContext:
    """Everything besides the tokens that goes into a key, fixed per request."""

    model_fingerprint: str
    tenant: str = "default"
    seam: float = 8

    def __post_init__(self) -> None:
        if not self.model_fingerprint:
            raise InvalidRequestError("model fingerprint must not be empty", param="model")
        seam_repr(self.seam)  # validates

    def key(self, token_ids: Sequence[int]) -> SegmentKey:
        return segment_key(token_ids, model_fingerprint=self.model_fingerprint, tenant=self.tenant, seam=self.seam)
