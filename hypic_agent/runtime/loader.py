"""Build an ``Engine`` from settings: the model (``runtime.model_loader.load_model``), its tokenizer,
the engine around them."""

from __future__ import annotations

from typing import Any

from hypic_agent.config import Settings
from hypic_agent.runtime.engine import Engine
from hypic_agent.runtime.hypic.cache import EntryCache
from hypic_agent.runtime.model_loader import load_model
from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer, tiny_tokenizer


def load_engine(
    settings: Settings, *, model: str | None = None, cache: EntryCache | None = None, progress: Any = None
) -> Engine:
    """Resolve, load and wrap the model in an ``Engine``; ``progress`` (a ``startup.StartupLog``)
    hears each stage (fetching, reading weights, building, tokenizer)."""
    net, source, fingerprint = load_model(settings, model=model, progress=progress)
    if progress:
        progress(f"loading the tokenizer of {source.name}")
    tokenizer = tiny_tokenizer() if source.kind in ("tiny", "random") else load_tokenizer(source)
    return Engine(net, tokenizer, fingerprint, settings, cache=cache, name=source.name, model_spec=model)
