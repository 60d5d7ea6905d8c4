"""Move big files through size-limited channels: split into parts, join with a sha256 check.

The GPU machine takes at most 64 MiB per call and hands back files of at most 16 MiB, so the
98 MB teacher GGUF travels in two parts and the distilled shards come back a few at a time::

    python -m hypic_agent.training.transfer split FILE OUT_DIR --part-mb 61
    python -m hypic_agent.training.transfer join PART... --out FILE --sha256 HEX
    python -m hypic_agent.training.transfer repack MODEL_DIR OUT_DIR --dtype int8 --no-tokenizer
    python -m hypic_agent.training.transfer attach-tokenizer OUT_DIR
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path

from hypic_agent.errors import WeightsError


def split_file(path: Path, out_dir: Path, part_bytes: int) -> list[Path]:
    """``out_dir/<name>.part0, .part1, ...`` of at most ``part_bytes`` each."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    with path.open("rb") as f:
        i = 0
        while block := f.read(part_bytes):
            p = out_dir / f"{path.name}.part{i}"
            p.write_bytes(block)
            parts.append(p)
            i += 1
    return parts


def join_parts(parts: list[Path], out: Path, sha256: str | None = None) -> Path:
    """Concatenate ``parts`` into ``out`` (atomically); raise ``WeightsError`` on a sha256 mismatch."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".joining")
    digest = hashlib.sha256()
    with tmp.open("wb") as dst:
        for p in parts:
            with p.open("rb") as src:
                while block := src.read(8 << 20):
                    digest.update(block)
                    dst.write(block)
    if sha256 and digest.hexdigest() != sha256:
        tmp.unlink()
        raise WeightsError(f"joined {len(parts)} parts have sha256 {digest.hexdigest()}, expected {sha256}")
    tmp.replace(out)
    return out


def repack(src: Path, dst: Path, *, dtype: str = "int8", shard_mb: float = 15.0, tokenizer: bool = True) -> Path:
    """Rewrite a distilled model folder's stored tensors in another dtype (``int8``: ~0.53x of bf16).

    Without ``tokenizer`` the tokenizer files are left out (fewer files to move; ``attach_tokenizer``
    writes them again from the base model)."""
    import json

    import torch
    from safetensors.torch import load_file

    from hypic_agent.runtime.models.loading.delta import DELTA_KEY, unpack
    from hypic_agent.runtime.models.loading.safetensors import weight_files
    from hypic_agent.training.delta import export_delta

    raw = json.loads((src / "config.json").read_text())
    meta = raw.pop(DELTA_KEY)
    raw.pop("dtype", None)
    stored: dict[str, torch.Tensor] = {}
    for f in weight_files(src):
        stored.update(load_file(str(f)))
    summary = json.loads((src / "distill.json").read_text()) if (src / "distill.json").is_file() else None
    export_delta(
        dst, raw, unpack(stored), meta["base"], dtype=getattr(torch, dtype), shard_mb=shard_mb, summary=summary
    )
    if tokenizer:
        for f in src.iterdir():
            if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
                shutil.copy2(f, dst / f.name)
    return dst


def attach_tokenizer(folder: Path) -> None:
    """Write the base model's tokenizer files into a distilled model folder."""
    import json

    from hypic_agent.config import Settings
    from hypic_agent.runtime.models.loading.catalog import resolve_model
    from hypic_agent.runtime.models.loading.delta import DELTA_KEY
    from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer, tiny_tokenizer

    base = json.loads((folder / "config.json").read_text())[DELTA_KEY]["base"]
    if "tiny" in base:
        tok = tiny_tokenizer()
    else:
        tok = load_tokenizer(resolve_model(base.get("catalog") or base["path"], Settings()))
    tok.save_pretrained(str(folder))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m hypic_agent.training.transfer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("out_dir", type=Path)
    s.add_argument("--part-mb", type=float, default=61.0)
    j = sub.add_parser("join")
    j.add_argument("parts", type=Path, nargs="+")
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--sha256")
    c = sub.add_parser("copy-shards", help="copy model shards [first, last) of a folder into a folder")
    c.add_argument("folder", type=Path)
    c.add_argument("dest", type=Path)
    c.add_argument("--first", type=int, default=0)
    c.add_argument("--count", type=int, default=4)
    r = sub.add_parser("repack", help="re-store a distilled model folder's tensors (e.g. int8 to move it)")
    r.add_argument("src", type=Path)
    r.add_argument("dst", type=Path)
    r.add_argument("--dtype", default="int8")
    r.add_argument("--shard-mb", type=float, default=15.0)
    r.add_argument("--no-tokenizer", action="store_true")
    t = sub.add_parser("attach-tokenizer", help="write the base tokenizer files into a distilled model folder")
    t.add_argument("folder", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "split":
        for p in split_file(a.file, a.out_dir, int(a.part_mb * 1_000_000)):
            print(p, p.stat().st_size)
    elif a.cmd == "join":
        print(join_parts(a.parts, a.out, a.sha256))
    elif a.cmd == "repack":
        print(repack(a.src, a.dst, dtype=a.dtype, shard_mb=a.shard_mb, tokenizer=not a.no_tokenizer))
    elif a.cmd == "attach-tokenizer":
        attach_tokenizer(a.folder)
    else:
        shards = sorted(a.folder.glob("model*.safetensors"))[a.first : a.first + a.count]
        a.dest.mkdir(parents=True, exist_ok=True)
        for p in shards:
            shutil.copy2(p, a.dest / p.name)
            print(a.dest / p.name)


if __name__ == "__main__":
    main()
