"""Lenient decoding of registry rows: raw column values (as the driver returns them) to an
``EntryRecord``, field by field. A value that does not decode (``meta`` that is not JSON, a
``token_ids`` blob of the wrong size, a ``created_at`` that is not a number, ...) is replaced by a
safe default and named in ``EntryRecord.damaged``, so one bad row never fails a lookup, a listing
or start-up; the store repairs such rows from the payload files' headers (``recovery.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from hypic_agent.segments.prompt.keys import token_digest, tokens_from_bytes
from hypic_agent.segments.store.integrity import lenient_text
from hypic_agent.segments.store.record import EntryRecord

_TIERS = ("gpu", "cpu", "disk", "none")
_STATES = ("writing", "ready")


class _Decoder:
    """Decodes one raw row field by field; what does not decode gets a default and is named."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw
        self.bad: list[str] = []

    def _fail(self, name: str, default: Any) -> Any:
        self.bad.append(name)
        return default

    def text(self, name: str, default: Any = None, *, required: bool = False) -> Any:
        v = self.raw.get(name)
        if isinstance(v, bytes | bytearray | memoryview) and not required:  # a key is never a blob
            v = lenient_text(bytes(v))
        if v is None and not required:
            return None
        if not isinstance(v, str) or (required and not v):
            return self._fail(name, default)
        return v

    def integer(self, name: str, default: int = 0) -> int:
        v = self.raw.get(name)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return int(self._fail(name, default))
        return v

    def number(self, name: str, default: float | None, *, optional: bool = False, positive: bool = False) -> Any:
        v = self.raw.get(name)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (positive and v <= 0):
            return self._fail(name, default)
        if v < 0 and not positive and name != "created_at" and name != "last_used_at":
            return self._fail(name, default)
        return float(v)

    def flag(self, name: str) -> bool:
        v = self.raw.get(name)
        if isinstance(v, bool) or v in (0, 1):
            return bool(v)
        return bool(self._fail(name, False))

    def choice(self, name: str, options: tuple[str, ...], default: str) -> Any:
        v = self.text(name, default)
        if v not in options:
            return self._fail(name, default) if name not in self.bad else default
        return v

    def tokens(self, *, digest: str | None, check_digest: bool, keep: bool) -> tuple[int, ...] | None:
        """The token ids (``keep``), checked: a blob of whole int32 values >= 0 and, with
        ``check_digest``, matching the row's token digest (checked on the array: start-up does
        this for every row)."""
        v = self.raw.get("token_ids")
        if v is None:
            return None
        if not isinstance(v, bytes | bytearray | memoryview) or len(v) % 4:
            return self._fail("token_ids", None)  # type: ignore[no-any-return]
        arr = np.frombuffer(bytes(v), dtype="<i4")
        if arr.size and int(arr.min()) < 0:
            return self._fail("token_ids", None)  # type: ignore[no-any-return]
        if check_digest and digest is not None and token_digest(arr) != digest:  # type: ignore[arg-type]
            return self._fail("token_ids", None)  # type: ignore[no-any-return]
        return tokens_from_bytes(bytes(v)) if keep else None

    def meta(self) -> dict[str, Any]:
        v = self.raw.get("meta")
        if v is None:
            return {}
        if isinstance(v, bytes | bytearray | memoryview):
            v = lenient_text(bytes(v))
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                return dict(self._fail("meta", {}))
        if not isinstance(v, dict):
            return dict(self._fail("meta", {}))
        return v


def decode_row(
    raw: Mapping[str, Any] | Any, *, with_payload_fields: bool = True, check_tokens: bool = False
) -> EntryRecord:
    """An ``EntryRecord`` from raw column values; never raises for a bad value (see ``damaged``).

    ``check_tokens``: also decode the token ids (and compare them with the token digest), then
    leave them out of the record (start-up reads every row this way)."""
    d = _Decoder(raw)
    created = d.number("created_at", None)
    last = d.number("last_used_at", None)
    created = created if created is not None else (last if last is not None else 0.0)
    last = last if last is not None else created
    digest = d.text("token_digest")
    ids = d.tokens(digest=digest, check_digest=check_tokens, keep=with_payload_fields)
    seq = raw.get("seq")
    rec = EntryRecord(
        key=d.text("key", "", required=True),
        tenant=d.text("tenant", "", required=True),
        kind=d.text("kind", "text", required=True),
        model_fingerprint=d.text("model_fingerprint", "", required=True),
        n_tokens=d.integer("n_tokens", len(ids) if ids is not None else 0),
        created_at=created,
        last_used_at=last,
        nbytes=d.integer("nbytes"),
        tier=d.choice("tier", _TIERS, "none"),
        location=d.text("location"),
        checksum=d.text("checksum"),
        hits=d.integer("hits"),
        pinned=d.flag("pinned"),
        ttl_s=d.number("ttl_s", None, optional=True, positive=True),
        prefill_ms=d.number("prefill_ms", 0.0),
        state=d.choice("state", _STATES, "ready"),
        token_digest=digest,
        token_ids=ids if with_payload_fields else None,
        text=d.text("text") if with_payload_fields else None,
        title=d.text("title"),
        meta=d.meta(),
        seq=int(seq) if isinstance(seq, int) else None,
        damaged=tuple(dict.fromkeys(d.bad)),
    )
    if "location" in rec.damaged or "tier" in rec.damaged:  # where the payload is: unknown
        rec = rec.replace(tier="none", location=None, checksum=None)
    return rec
