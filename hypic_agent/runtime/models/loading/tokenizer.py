"""Tokenizers: a local HF folder, a GGUF file, or the built-in byte-level tiny tokenizer.

Everything is local: ``load_tokenizer`` never reaches the Hugging Face Hub.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypic_agent.errors import ModelConfigError, ModelNotAvailableError
from hypic_agent.runtime.models.testing.tiny import TINY_VOCAB_SIZE

if TYPE_CHECKING:
    from hypic_agent.runtime.models.loading.catalog import ModelSource

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (256 entries)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def tiny_tokenizer() -> Any:
    """Offline byte-level tokenizer: id ``b`` is byte ``b`` (0..255), then the 3 ChatML specials.

    ``<|endoftext|>`` = 256 (pad), ``<|im_start|>`` = 257, ``<|im_end|>`` = 258 (eos). Returns a
    transformers ``PreTrainedTokenizerFast`` with a ChatML ``chat_template``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=1 << 20,
    )
    assert len(fast) == TINY_VOCAB_SIZE, len(fast)
    return fast


def load_tokenizer(source: ModelSource | str | Path) -> Any:
    """The tokenizer for a model source.

    ``source``: a ``ModelSource`` (from ``catalog.resolve_model``), ``"tiny"`` / ``"tiny:<arch>"``,
    a local HF folder (AutoTokenizer, ``local_files_only``) or a ``.gguf`` file (the tokenizer
    embedded in the GGUF metadata).
    """
    kind = getattr(source, "kind", None)
    if kind == "tiny" or (isinstance(source, str) and (source == "tiny" or source.startswith("tiny:"))):
        return tiny_tokenizer()
    raw_path: Any = getattr(source, "path", None) if kind is not None else source
    if raw_path is None:
        raise ModelConfigError(f"model source {source!r} has no path to load a tokenizer from")
    path = Path(raw_path).expanduser()
    from transformers import AutoTokenizer

    if path.is_file() and path.suffix == ".gguf":
        try:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as e:  # gguf reader / tokenizer conversion errors
            first = e
        try:  # architectures transformers' GGUF config reader lacks (Granite 4, Nemotron-H): the tokenizer alone
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception:
            raise ModelConfigError(f"cannot read the tokenizer embedded in {path}: {first}") from first
    if path.is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ModelConfigError(
                f"no usable tokenizer in {path}: {e}. The folder needs tokenizer.json (or the "
                "tokenizer files of the model) next to config.json."
            ) from e
    raise ModelNotAvailableError(
        f"tokenizer source {str(path)!r} is neither a model folder nor a .gguf file", param="model"
    )
