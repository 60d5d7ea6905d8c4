"""``RemoteEngine``: the engine as the API process sees it when the engine runs in its own process.

What the API reads of an ``Engine`` (name, fingerprint, context window, settings, the tokenizer, stop
ids, ``pieces``) with the same names, from the ``Ready`` message's ``EngineFacts`` and tokenizer: no
weights here. ``prewarm`` and ``entry_tokens`` run in the engine process (they need the model and the
store)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.runtime.core_process.client import EngineClient
from hypic_agent.runtime.prompt_pieces import PlanLike, PromptPieces
from hypic_agent.runtime.results import SegmentUsage


class RemoteEngine:
    def __init__(self, client: EngineClient) -> None:
        facts = client.facts
        assert facts is not None, "the engine process is not ready"
        self.client = client
        self.settings: Settings = client.settings
        self.tokenizer: Any = client.tokenizer
        self.name = facts.name
        self.fingerprint = facts.fingerprint
        self.max_context = facts.max_context
        self.vocab_size = facts.vocab_size
        self.eos_ids = facts.eos_ids
        self.device = facts.device

    def pieces(
        self, plan: PlanLike, *, mode: str | None = None, seam: float | str | None = None, max_new_tokens: int = 0
    ) -> PromptPieces:
        return self.client.pieces(plan, mode=mode, seam=seam, max_new_tokens=max_new_tokens)

    def prewarm(
        self,
        segments: Sequence[Sequence[int]],
        kinds: Sequence[str],
        *,
        tenant: str = "default",
        mode: str | None = None,
        seam: float | str | None = None,
        hints: Mapping[str, Any] | None = None,
    ) -> list[SegmentUsage]:
        """``Engine.prewarm`` in the engine process (with the PUT's registry hints); waits as long as
        the build takes (or until the engine process dies)."""
        segs = [tuple(int(t) for t in s) for s in segments]
        return self.client.call(
            "prewarm", segs, list(kinds), tenant=tenant, mode=mode, seam=seam, hints=dict(hints or {}), timeout=None
        )

    def entry_tokens(self, pieces: PromptPieces, tenant: str, every: bool = False) -> list[int]:
        """``api.limits.new_entry_tokens`` in the engine process (keys and the store's contents are there)."""
        return self.client.call("entry_tokens", pieces, tenant, every)
