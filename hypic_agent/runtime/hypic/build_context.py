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
context is never served under another. A prompt's first segment is built without it (nothing
precedes it, so its isolated rows are exact) and keyed so (``SeamPlanner.entry_key``, ``ColdBuilds``).

Choices (``Settings.build_prefix``):

* ``none``: the isolated build (no context);
* ``bos``: the tokenizer's BOS token (SmolLM2: ``<|im_start|>``);
* ``template``: the chat template's system-turn header, the tokens a system message renders before
  its content (ChatML: ``<|im_start|>system\\n``); the plain framing's ``System: `` without a template;
* ``document``: what a document in a real prompt follows: a whole system turn carrying
  ``Settings.build_system_prompt`` (the application's system prompt; empty: an empty turn), then one
  neutral framed document (``FILLER``). The body's rows then look like those of a document in the
  middle of a prompt rather than at its start: on the v1 hybrid, whose attention sink spans the
  first ~16 tokens of a fresh sequence, this is what closes most of the gap to ``full_recompute``
  (``docs/benchmarks.md``, "quality"). It costs its ~50 tokens once per entry build, never per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash

from hypic_agent.errors import ModelConfigError
from hypic_agent.segments.prompt.framing import header_block

_SENTINEL = "hypic-build-context-sentinel"
# ``document``: the neutral document after the system turn (title, text), framed as documents are
FILLER = (
    "Notes",
    "The following passages are taken from an encyclopedia. Each passage describes one topic and gives the "
    "names, dates and places that belong to it.",
)


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


def context_at(ctx: BuildContext, index: int) -> BuildContext:
    """The context segment ``index`` of a prompt is built after: none for the first segment (nothing
    precedes it in the prompt, so its isolated rows are exact), ``ctx`` for the others."""
    return NO_CONTEXT if index == 0 else ctx


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


def _system_turn(tokenizer: Any, system_prompt: str) -> str:
    """A whole system turn carrying ``system_prompt``, as the chat template renders it."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template([{"role": "system", "content": system_prompt}], tokenize=False))
    return f"System: {system_prompt}\n\n"


def resolve_build_context(name: str, tokenizer: Any, system_prompt: str = "") -> BuildContext:
    """``Settings.build_prefix`` -> the context's tokens (see module doc; ``system_prompt``:
    ``Settings.build_system_prompt``, read by ``document`` only). Raises ``ModelConfigError`` when the
    tokenizer has no such tokens (``bos`` without a BOS token, an empty header)."""
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
    if name == "document":
        text = _system_turn(tokenizer, system_prompt) + header_block("document", FILLER[1], FILLER[0])
        return BuildContext("document", tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False)))
    raise ModelConfigError(f"unknown build_prefix {name!r}: use none, bos, template or document")
