"""Resumable training checkpoints: the saved (trainable + new) tensors, optimizer state, progress.

Folder layout (``<out>/ckpt``)::

    weights.safetensors   every mixer tensor and every trainable tensor, fp32 (name contract)
    optimizer.pt          AdamW state keyed by parameter name (optional on resume)
    state.json            step, elapsed seconds, student HF config, base reference, run config, history

Everything else of the student is derived from the teacher (``runtime/models/loading/delta.derived_tensors``), so
a checkpoint is about 4 bytes x 47M parameters for SmolLM2 (plus 2x that for AdamW moments).
Files are written to temporary names and renamed, so an interrupted save leaves the previous one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hypic_agent.errors import WeightsError


@dataclass
class TrainState:
    """Progress of a run (``state.json``)."""

    step: int
    elapsed_s: float
    student_config: dict[str, Any]
    base: dict[str, Any]
    run: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    report: list[dict[str, float]] = field(default_factory=list)


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    write(tmp)
    tmp.replace(path)


def save_checkpoint(
    folder: Path,
    tensors: dict[str, torch.Tensor],
    state: TrainState,
    optimizer: torch.optim.Optimizer | None = None,
    names: dict[torch.nn.Parameter, str] | None = None,
) -> None:
    """Write ``tensors`` (fp32, CPU), the optimizer state (keys mapped to names) and ``state``."""
    folder.mkdir(parents=True, exist_ok=True)
    cpu = {k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}
    _atomic(folder / "weights.safetensors", lambda p: save_file(cpu, str(p)))
    if optimizer is not None and names is not None:
        sd = optimizer.state_dict()
        ids = [names[p] for g in optimizer.param_groups for p in g["params"]]
        by_name = {ids[i]: v for i, v in sd["state"].items()}
        _atomic(folder / "optimizer.pt", lambda p: torch.save({"state": by_name, "groups": sd["param_groups"]}, p))
    _atomic(folder / "state.json", lambda p: p.write_text(json.dumps(state.__dict__, indent=1)))


def has_checkpoint(folder: Path) -> bool:
    return (folder / "state.json").is_file() and (folder / "weights.safetensors").is_file()


def load_checkpoint(folder: Path) -> tuple[TrainState, dict[str, torch.Tensor]]:
    """``(state, tensors)`` of a checkpoint folder."""
    if not has_checkpoint(folder):
        raise WeightsError(f"no checkpoint in {folder} (state.json + weights.safetensors); run without --resume")
    state = TrainState(**json.loads((folder / "state.json").read_text()))
    return state, load_file(str(folder / "weights.safetensors"))


def restore_optimizer(
    folder: Path, optimizer: torch.optim.Optimizer, names: dict[torch.nn.Parameter, str], device: torch.device
) -> bool:
    """Load AdamW moments saved by ``save_checkpoint``; False when absent (fresh moments)."""
    path = folder / "optimizer.pt"
    if not path.is_file():
        return False
    saved = torch.load(path, map_location=device, weights_only=True)
    ids = [names[p] for g in optimizer.param_groups for p in g["params"]]
    missing = [n for n in ids if n not in saved["state"]]
    if missing:
        raise WeightsError(
            f"optimizer.pt in {folder} lacks state for {len(missing)} parameters (e.g. {missing[:2]}); "
            "it belongs to a run with other trainable parameters: delete it to restart the moments"
        )
    sd = {
        "state": {i: saved["state"][n] for i, n in enumerate(ids)},
        "param_groups": optimizer.state_dict()["param_groups"],
    }
    optimizer.load_state_dict(sd)
    return True
