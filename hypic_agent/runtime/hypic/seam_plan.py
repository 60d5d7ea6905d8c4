"""Seam widths and entry keys of a composed prompt's segments (the planner's first step).

A fixed seam ``w`` gives every segment ``seam_tokens(w, len)``; ``seam="auto"`` asks ``auto_seams``
for per-segment widths under ``Settings.seam_budget`` and ``seam="blend"`` asks ``hypic.blend`` for
widths plus the body tokens to recompute (both read per-segment deviation profiles, computed on the
model the first time a segment is seen: ``profiles``). A segment gets an entry key when it is
cacheable: not the BOS piece, at least ``min_cached_tokens`` long, and longer than its seam. The key
covers its tokens, the tenant, its seam and the model fingerprint tagged with the build context
(``build_context.key_fingerprint``), so entries built after another prefix never mix.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from hypic_agent.config import Settings
from hypic_agent.runtime.hypic.auto_seams import AUTO, ProfileTable, plan_seams
from hypic_agent.runtime.hypic.blend import BLEND, BlendPlan, plan_blend
from hypic_agent.runtime.hypic.build_context import BuildContext, context_at, key_fingerprint, resolve_build_context
from hypic_agent.runtime.hypic.modes import seam_tokens
from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.runtime.prompt_pieces import PromptPieces
from hypic_agent.segments.prompt.keys import segment_key


class SeamPlanner:
    """Seams, keys and the blend plan of composed prompts for one model (``Engine.seams``)."""

    def __init__(
        self, model: HybridForCausalLM, tokenizer: Any, fingerprint: str, settings: Settings, lock: threading.RLock
    ) -> None:
        self.model, self.tokenizer, self.fingerprint, self.settings = model, tokenizer, fingerprint, settings
        self.lock = lock  # the engine's: profiles not seen yet run on the model
        self.profiles = ProfileTable()  # seam="auto" / "blend": per-segment deviation profiles
        self._build_contexts: dict[tuple[str, str], BuildContext] = {}

    def build_context(self) -> BuildContext:
        """The tokens cold segments are prefilled after (``Settings.build_prefix``; resolved once per
        value, so a setting changed between requests takes effect on the next one)."""
        name, system = self.settings.build_prefix, self.settings.build_system_prompt
        ctx = self._build_contexts.get((name, system))
        if ctx is None:
            ctx = self._build_contexts[(name, system)] = resolve_build_context(name, self.tokenizer, system)
        return ctx

    def entry_key(self, token_ids: Sequence[int], tenant: str, seam: float, first: bool = False) -> str:
        """The key of a segment's entry (tokens, tenant, seam, fingerprint with the tag of the context it
        is built after). ``first``: the prompt's first segment, built without a context (``context_at``)."""
        fp = key_fingerprint(self.fingerprint, context_at(self.build_context(), 0 if first else 1))
        return segment_key(token_ids, model_fingerprint=fp, tenant=tenant, seam=seam)

    def plan(self, p: PromptPieces, tenant: str) -> tuple[list[int], list[str | None], BlendPlan | None]:
        """Per segment of ``p`` its seam width and entry key (None: not cacheable), and with
        ``seam="blend"`` the plan that picks the body tokens recomputed once the entries are there
        (None otherwise). With ``auto`` / ``blend`` the keys carry each segment's own width."""
        fixed = self._fixed_width(p)
        auto = fixed is None
        eff = 0.0 if fixed is None else fixed
        seams = [seam_tokens(eff, len(s)) for s in p.segs]
        blend: BlendPlan | None = None
        min_tokens = self.settings.min_cached_tokens
        if auto:
            base = [
                self.entry_key(s, tenant, 0, i == 0) if k != "bos" and len(s) >= min_tokens else None
                for i, (s, k) in enumerate(zip(p.segs, p.kinds, strict=True))
            ]
            budget, build = self.settings.seam_budget, self.build_context().tokens
            with self.lock:
                if p.w == BLEND:
                    n_suffix = len(p.suffix)
                    blend = plan_blend(self.model, self.profiles, self.tokenizer, p.segs, base, budget, n_suffix, build)
                    seams = blend.seams
                else:
                    seams = plan_seams(self.model, self.profiles, self.tokenizer, p.segs, base, budget, build)
        cacheable = [
            k != "bos" and len(s) >= min_tokens and seams[i] < len(s)
            for i, (s, k) in enumerate(zip(p.segs, p.kinds, strict=True))
        ]
        keys = [
            self.entry_key(s, tenant, seams[i] if auto else eff, i == 0) if c else None
            for i, (s, c) in enumerate(zip(p.segs, cacheable, strict=True))
        ]
        return seams, keys, blend

    def every_key(self, p: PromptPieces, tenant: str) -> tuple[list[int], list[str]]:
        """``plan``'s seams with a key for every segment, also those a prompt would recompute (a PUT
        stores each segment it is given)."""
        seams, keys, _ = self.plan(p, tenant)
        w = self._fixed_width(p)
        return seams, [
            k if k is not None else self.entry_key(s, tenant, seams[i] if w is None else w, i == 0)
            for i, (s, k) in enumerate(zip(p.segs, keys, strict=True))
        ]

    @staticmethod
    def _fixed_width(p: PromptPieces) -> float | None:
        """The one seam every segment of ``p`` gets (0 in modes without seams); None: per-segment
        widths (``auto`` / ``blend``)."""
        if not p.spec.seams:
            return 0.0
        return None if p.w in (AUTO, BLEND) else float(p.w)
