"""``BuildContext``: the fixed tokens a cold segment is prefilled after (its build-time sink).

An isolated build runs every segment from a zero state at position 0, so the segment's own first
token becomes the attention sink and its body attends to little else (``docs/benchmarks.md``,
"deviation"). With a build context the packed batch holds ``[context | segment]`` per segment: the
context tokens sit at positions ``-K..-1`` (the segment keeps its local positions ``0..n-1``, so
the stored un-rotated keys and a rotating linear mixer's states keep their base position 0), every
layer of the segment sees them, and their rows are dropped from the entry. Linear layers' pairs
still cover the segment's body only, from the identity / zero state (the context is part of the
build's seam window), so composition stays exact; only the body's *layer inputs* change.

The context's tokens are part of every entry key (``key_fingerprint``): an entry built after one
context is never served under another.

Choices (``Settings.build_prefix``):

* ``none``: the isolated build (no context);
* ``bos``: the tokenizer's BOS token (SmolLM2: ``<|im_start|>``);
* ``template``: the chat template's system-turn header, the tokens a system message renders before
  its content (ChatML: ``<|im_start|>system\\n``); the plain framing's ``System: `` without a template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

from hypic_agent.errors import ModelConfigError

_SENTINEL = "hypic-build-context-sentinel"


@dataclass(frozen=True)
class BuildContext:
    """``name`` (the setting it came from) and ``tokens`` ``[K]`` (empty: isolated builds)."""

    name: str = "none"
    tokens: tuple[int, ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def tag(self) -> str:
        """What keys carry: ``""`` without a context (keys as before), else ``"build:<name>:<16 hex>"``
        over the token ids (two contexts of the same name but other tokens never share entries)."""
        if not self.tokens:
            return ""
        digest = xxhash.xxh3_64_hexdigest(",".join(map(str, self.tokens)).encode())
        return f"build:{self.name}:{digest}"


NO_CONTEXT = BuildContext()


def key_fingerprint(model_fingerprint: str, ctx: BuildContext) -> str:
    """The model part of an entry key under ``ctx``: the fingerprint itself without a context."""
    tag = ctx.tag()
    return model_fingerprint if not tag else f"{model_fingerprint}|{tag}"


def _template_header(tokenizer: Any) -> list[int]:
    """The system-turn header's tokens: what the chat template renders before a system message's content."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "system", "content": _SENTINEL}], tokenize=False)
        head = str(text).split(_SENTINEL)[0]
    else:
        head = "System: "
    return list(tokenizer.encode(head, add_special_tokens=False))


def resolve_build_context(name: str, tokenizer: Any) -> BuildContext:
    """``Settings.build_prefix`` -> the context's tokens (see module doc). Raises ``ModelConfigError`` when
    the tokenizer has no such tokens (``bos`` without a BOS token, an empty header)."""
    if name == "none":
        return NO_CONTEXT
    if name == "bos":
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            raise ModelConfigError("build_prefix='bos' needs a tokenizer with a BOS token")
        return BuildContext("bos", (int(bos),))
    if name == "template":
        ids = _template_header(tokenizer)
        if not ids:
            raise ModelConfigError("build_prefix='template': the chat template renders no system header")
        return BuildContext("template", tuple(int(t) for t in ids))
    raise ModelConfigError(f"unknown build_prefix {name!r}: use none, bos or template")
