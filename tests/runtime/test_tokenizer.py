"""Tiny byte-level tokenizer and ``load_tokenizer`` over folders, GGUF files and tiny sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypic_agent.errors import ModelConfigError, ModelNotAvailableError
from hypic_agent.runtime.models.loading.catalog import ModelSource
from hypic_agent.runtime.models.loading.tokenizer import load_tokenizer, tiny_tokenizer
from hypic_agent.runtime.models.testing.tiny import TINY_BOS_ID, TINY_EOS_ID, TINY_PAD_ID, TINY_VOCAB_SIZE

TEXT = "Héllo wörld! 😀\n\t  <not special> end"


def test_tiny_tokenizer_is_bytes_plus_specials() -> None:
    tok = tiny_tokenizer()
    assert len(tok) == TINY_VOCAB_SIZE
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert ids == list(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        TINY_PAD_ID,
        TINY_BOS_ID,
        TINY_EOS_ID,
    ]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == TINY_EOS_ID
    assert tok.pad_token_id == TINY_PAD_ID
    # specials are single tokens inside text and vanish with skip_special_tokens
    ids = tok("a<|im_start|>b<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids == [97, TINY_BOS_ID, 98, TINY_EOS_ID]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"


def test_tiny_tokenizer_chat_template() -> None:
    tok = tiny_tokenizer()
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == TINY_BOS_ID and ids.count(TINY_EOS_ID) == 2


def test_load_tokenizer_tiny_sources() -> None:
    for src in ("tiny", "tiny:llama", ModelSource(name="tiny:qwen3_next", kind="tiny", arch="qwen3_next")):
        assert len(load_tokenizer(src)) == TINY_VOCAB_SIZE


def test_load_tokenizer_from_folder(tmp_path: Path) -> None:
    tiny_tokenizer().save_pretrained(tmp_path)
    for src in (tmp_path, str(tmp_path), ModelSource(name="x", kind="hf", path=tmp_path)):
        tok = load_tokenizer(src)
        assert tok(TEXT, add_special_tokens=False)["input_ids"] == list(TEXT.encode())
        assert tok.eos_token_id == TINY_EOS_ID and tok.chat_template == tiny_tokenizer().chat_template


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelConfigError, match="tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(ModelNotAvailableError):
        load_tokenizer(tmp_path / "nope")
