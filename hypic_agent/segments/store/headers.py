"""The self-describing header of a payload file, and registry rows rebuilt from it.

Each disk file's safetensors metadata keeps the fields older files had (``key``, ``tenant``,
``kind``, ``model_fingerprint``, ``token_digest``) and, from header version 1 on, the entry's row
as JSON under ``row``: identity, ``n_tokens``, the token ids (base64 of little-endian int32),
``created_at``, ``prefill_ms``, pin and TTL as written, payload ``nbytes``, framed text, title and
metadata. ``disk_tier.DiskTier`` adds ``row_xxh3`` and ``data_xxh3`` so a rebuild trusts only what
checks out. A header tells the row as it was when the file was written: a later PATCH of pin or
TTL, hit counts and last-used times live only in the registry.

``record_from_header`` turns a checked header (``disk_tier.FileHeader``) into an ``EntryRecord``
(``tier = disk``); ``repair`` fills a damaged row's bad fields from one. Old files (no ``row``)
rebuild too: their token ids come from the payload's own ``token_ids`` tensor when its digest
matches, their ``created_at`` from the file's mtime, text / title / metadata are unknown.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import fields
from pathlib import PurePosixPath
from typing import Any

from hypic_agent.segments.prompt.keys import token_bytes, token_digest, tokens_from_bytes
from hypic_agent.segments.store.disk_tier import CorruptEntryError, FileHeader
from hypic_agent.segments.store.entries import EntryMeta, IndexEntry
from hypic_agent.segments.store.record import IDENTITY, EntryRecord

ROW_VERSION = 1


def row_header(entry: IndexEntry, meta: EntryMeta) -> dict[str, str]:
    """The metadata a payload file of ``entry`` is written with (all values strings)."""
    md = {
        "key": entry.key,
        "model_fingerprint": entry.model_fingerprint,
        "tenant": entry.tenant,
        "token_digest": entry.token_digest or "",
        "kind": entry.kind,
    }
    row: dict[str, Any] = {
        "v": ROW_VERSION,
        "key": entry.key,
        "tenant": entry.tenant,
        "kind": entry.kind,
        "model_fingerprint": entry.model_fingerprint,
        "n_tokens": entry.n_tokens,
        "token_digest": entry.token_digest,
        "token_ids": base64.b64encode(token_bytes(meta.token_ids)).decode() if meta.token_ids is not None else None,
        "created_at": entry.created_at,
        "prefill_ms": entry.prefill_ms,
        "pinned": entry.pinned,
        "ttl_s": entry.ttl_s,
        "nbytes": entry.nbytes,
        "text": meta.text,
        "title": meta.title,
        "meta": dict(meta.extra),
    }
    try:  # ASCII JSON: lone surrogates and the like stay escapes, never invalid UTF-8
        md["row"] = json.dumps(row, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):  # metadata JSON cannot carry: the row without it
        row["meta"] = {}
        md["row"] = json.dumps(row, allow_nan=False, separators=(",", ":"))
    return md


def record_from_header(h: FileHeader, now: float) -> EntryRecord:
    """The registry row ``h`` describes (``last_used_at = now``, no hits); raises
    ``CorruptEntryError`` when the header is not enough to rebuild one."""
    md = h.metadata
    row: dict[str, Any] = {}
    if "row" in md:
        try:
            parsed = json.loads(md["row"])
        except ValueError as exc:
            raise CorruptEntryError(f"{h.location}: row header is not JSON") from exc
        if not isinstance(parsed, dict):
            raise CorruptEntryError(f"{h.location}: row header is not an object")
        row = parsed

    def text(name: str) -> str | None:
        v = row.get(name, md.get(name))
        return v if isinstance(v, str) and v else None

    ident = {name: text(name) for name in IDENTITY}
    missing = [name for name, v in ident.items() if v is None and name != "kind"]
    if missing:
        raise CorruptEntryError(f"{h.location}: header lacks {', '.join(missing)}; cannot rebuild its row")
    key = str(ident["key"])
    if not PurePosixPath(h.location).name.startswith(key + "."):
        raise CorruptEntryError(f"{h.location}: header names another key ({key})")
    digest = text("token_digest")
    ids = _token_ids(row.get("token_ids"), digest)
    if ids is None and h.token_ids is not None and (digest is None or token_digest(h.token_ids) == digest):
        ids = h.token_ids
    n_tokens = _count(row.get("n_tokens"))
    created, ttl, prefill = _time(row.get("created_at")), _time(row.get("ttl_s")), _time(row.get("prefill_ms"))
    title, body, extra = row.get("title"), row.get("text"), row.get("meta")
    return EntryRecord(
        key=key,
        tenant=str(ident["tenant"]),
        kind=ident["kind"] or "text",
        n_tokens=n_tokens if n_tokens is not None else (len(ids) if ids is not None else 0),
        model_fingerprint=str(ident["model_fingerprint"]),
        created_at=created if created is not None else h.mtime,
        last_used_at=now,
        nbytes=h.nbytes,
        tier="disk",
        location=h.location,
        checksum=h.checksum,
        pinned=row.get("pinned") is True,
        ttl_s=ttl if ttl else None,
        prefill_ms=prefill or 0.0,
        state="ready",
        token_digest=digest,
        token_ids=ids,
        text=body if isinstance(body, str) else None,
        title=title if isinstance(title, str) else None,
        meta=extra if isinstance(extra, dict) else {},
    )


def repair(rec: EntryRecord, source: EntryRecord | None, now: float) -> EntryRecord:
    """``rec`` with its ``damaged`` fields taken from ``source`` (a row rebuilt from the payload
    file's header), or, without one, left at the decoder's defaults; never the identity fields
    (the caller rebuilds or quarantines a row whose identity is damaged)."""
    if source is None:
        fixed = rec
        if "created_at" in rec.damaged and "last_used_at" in rec.damaged:
            fixed = fixed.replace(created_at=now, last_used_at=now)
        if "token_ids" in rec.damaged:  # tokens that do not match their digest are not kept as if sound
            fixed = fixed.replace(token_ids=None)
        return fixed.replace(damaged=())
    names = {f.name for f in fields(EntryRecord)} - {"seq", "damaged", *IDENTITY}
    changes = {name: getattr(source, name) for name in rec.damaged if name in names}
    if "token_ids" in rec.damaged:  # the tokens and the digest they are checked against go together
        changes["token_digest"] = source.token_digest if source.token_ids is not None else rec.token_digest
    if {"location", "tier"} & set(rec.damaged):
        changes.update(tier=source.tier, location=source.location, checksum=source.checksum)
    return rec.replace(**changes, damaged=())


def _token_ids(value: Any, digest: str | None) -> tuple[int, ...] | None:
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    if len(raw) % 4:
        return None
    ids = tokens_from_bytes(raw)
    return ids if digest is None or token_digest(ids) == digest else None


def _time(v: Any) -> float | None:
    """A finite number >= 0 (seconds, milliseconds), else ``None``."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return float(v)
    return None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
