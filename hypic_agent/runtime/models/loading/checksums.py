"""``SHA256SUMS`` of a model folder: the sha256 of every file, in ``sha256sum`` format.

The weights shipped inside the package (``hypic_agent/weights/<name>/``) carry one; the loader
(``weights.load_checkpoint``) checks it before reading such a folder, so a truncated or edited
file fails with its name instead of loading wrong weights. ``sha256sum -c SHA256SUMS`` checks
the same by hand; ``write_checksums`` (re)writes it after the files change.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hypic_agent.errors import WeightsError

CHECKSUMS = "SHA256SUMS"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_checksums(folder: Path) -> dict[str, str]:
    """``{file name: sha256}`` from ``folder/SHA256SUMS`` (``<hex>  <name>`` lines)."""
    out: dict[str, str] = {}
    path = folder / CHECKSUMS
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise WeightsError(f"{path} line {n} is not '<sha256>  <file name>': {line[:80]!r}")
        out[name.lstrip("*")] = digest.lower()
    return out


def verify_checksums(folder: str | Path) -> list[str]:
    """Check every file ``SHA256SUMS`` names; ``WeightsError`` naming the first missing or changed
    file. Returns the names checked."""
    folder = Path(folder)
    sums = read_checksums(folder)
    for name, want in sums.items():
        path = folder / name
        if not path.is_file():
            raise WeightsError(
                f"{path} is missing ({CHECKSUMS} lists it); the model folder is incomplete: reinstall the "
                "package (or restore the file)"
            )
        got = file_sha256(path)
        if got != want:
            raise WeightsError(
                f"{path} has sha256 {got}, but {CHECKSUMS} says {want}: the file is corrupt or was changed; "
                "reinstall the package (or restore the file)"
            )
    return list(sums)


def write_checksums(folder: str | Path) -> Path:
    """Write ``folder/SHA256SUMS`` for every file of the folder (sorted by name)."""
    folder = Path(folder)
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS)
    path = folder / CHECKSUMS
    path.write_text("".join(f"{file_sha256(folder / n)}  {n}\n" for n in names))
    return path


_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def cached_file_sha256(path: Path) -> str:
    """``file_sha256``, remembered per path, size and mtime within the process (base weights are
    checked on every load of a delta folder)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        _SHA_MEMO[key] = file_sha256(path)
    return _SHA_MEMO[key]
