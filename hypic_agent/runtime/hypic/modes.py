"""The ladder of modes, for honest comparison on identical prompt tokens.

| mode              | linear layers            | attention bodies         | seams |
|-------------------|--------------------------|--------------------------|-------|
| full_recompute    | one pass                 | one pass                 | -     |
| prefix_cache      | exact prefix reuse only  | exact prefix reuse only  | -     |
| addition          | S += S_C (drops T_C)     | spliced, local positions | no    |
| transition        | S = T_C S + S_C          | spliced, local positions | no    |
| transition_rope   | S = T_C S + S_C          | re-rotated to global     | no    |
| hypic             | S = T_C S + S_C          | re-rotated to global     | yes   |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from hypic_agent.config import MODES
from hypic_agent.errors import InvalidRequestError, UnknownModeError


class Strategy(Enum):
    """How a request's prompt state is built (what the scheduler and the engine dispatch on)."""

    FULL = "full"  # one pass over the whole prompt, in prefill chunks
    PREFIX = "prefix"  # the longest cached exact prefix (the radix cache over the pool), then chunks
    COMPOSED = "composed"  # cached segment entries + recomputed active rows (a combine)


@dataclass(frozen=True)
class ModeSpec:
    name: str
    strategy: Strategy
    transition: bool = True  # apply T_C (False: naive addition)
    rerotate: bool = True  # RoPE of cached keys at their global positions
    seams: bool = True  # recompute the first w tokens of each segment

    @property
    def composed(self) -> bool:
        """Built from cached segment entries (vs one pass / prefix reuse)."""
        return self.strategy is Strategy.COMPOSED


SPECS: dict[str, ModeSpec] = {
    "full_recompute": ModeSpec("full_recompute", Strategy.FULL),
    "prefix_cache": ModeSpec("prefix_cache", Strategy.PREFIX),
    "addition": ModeSpec("addition", Strategy.COMPOSED, transition=False, rerotate=False, seams=False),
    "transition": ModeSpec("transition", Strategy.COMPOSED, rerotate=False, seams=False),
    "transition_rope": ModeSpec("transition_rope", Strategy.COMPOSED, seams=False),
    "hypic": ModeSpec("hypic", Strategy.COMPOSED),
}
assert tuple(SPECS) == MODES


def mode_spec(name: str) -> ModeSpec:
    """Look a mode up by name; alias ``transition_rope_recompute`` is the published name of ``hypic``."""
    if name == "transition_rope_recompute":
        name = "hypic"
    spec = SPECS.get(name)
    if spec is None:
        raise UnknownModeError(f"unknown mode {name!r}; choose one of {', '.join(MODES)}", param="mode")
    return spec


def validate_seam(w: float | str) -> float | str:
    """A fixed seam as a float, ``"auto"`` (``auto_seams``: widths chosen per segment under
    ``Settings.seam_budget``) or ``"blend"`` (``blend``: seams and scattered body tokens under it)."""
    if w in ("auto", "blend"):
        return w
    if not isinstance(w, int | float) or math.isnan(w) or w < 0:
        raise InvalidRequestError(
            'seam must be "auto", "blend" or >= 0 (0 = none, (0,1] = fraction, > 1 = tokens)', param="seam"
        )
    if w > 1 and float(w) != int(w):
        raise InvalidRequestError("seam > 1 is a token count and must be an integer", param="seam")
    return float(w)


def seam_tokens(w: float, n_tokens: int) -> int:
    """Seam width in tokens for a segment of ``n_tokens``: 0 = none, 0 < w <= 1 a fraction
    (rounded up), w > 1 a token count; never more than the segment (a segment shorter than its
    seam is recomputed whole)."""
    if w <= 0 or n_tokens == 0:
        return 0
    width = math.ceil(w * n_tokens) if w <= 1 else int(w)
    return min(width, n_tokens)
