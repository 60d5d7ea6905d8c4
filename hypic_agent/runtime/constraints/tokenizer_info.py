"""xgrammar's ``TokenizerInfo`` for one of our tokenizers (``runtime/models/loading/tokenizer.py``).

The grammar engine needs every token's bytes, the vocabulary type (byte-level BPE, byte fallback,
raw) and the stop tokens. We take the vocabulary from the tokenizer itself (the tiny byte-level
one, a GGUF-embedded or a Hugging Face one: all transformers fast tokenizers), then blank out the
special tokens (``<|im_start|>`` & co.): a byte-level vocabulary spells them as plain text, and
the engine would otherwise let a grammar emit them inside a JSON string. Blank tokens are never
allowed, except the stop tokens, which the engine allows exactly where the grammar may end.

The mask size is the *model's* vocabulary (its logits), which can exceed the tokenizer's.
Built once per (tokenizer, vocab size, stop ids): the Hugging Face scan of a 150k vocabulary
takes ~0.1-1 s.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()
_CACHE: dict[tuple[int, int, tuple[int, ...]], Any] = {}


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens (added tokens marked special, and ``all_special_ids``)."""
    out = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    for idx, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            out.add(int(idx))
    return out


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...]) -> Any:
    """The (cached) ``xgrammar.TokenizerInfo`` for ``tokenizer`` with a mask of ``vocab_size``."""
    key = (id(tokenizer), int(vocab_size), tuple(sorted(stop_ids)))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    info = _build(tokenizer, vocab_size, list(key[2]))
    with _LOCK:
        _CACHE[key] = (tokenizer, info)  # keep the tokenizer alive so its id() is not reused
    return info


def _build(tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> Any:
    import xgrammar as xgr

    # detection (vocab type, prefix space) is xgrammar's own; the vocabulary we build ourselves
    detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
    blank = special_ids(tokenizer) - set(stop_ids)
    encoded: list[str] = [""] * vocab_size
    for piece, idx in tokenizer.get_vocab().items():
        if idx < vocab_size and idx not in blank:
            encoded[idx] = piece
    return xgr.TokenizerInfo(
        encoded,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stop_ids,
        add_prefix_space=detected.add_prefix_space,
    )
