"""Fixtures for segment tests: a tiny offline tokenizer and registry URLs (SQLite, PostgreSQL)."""

from __future__ import annotations

import os

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "Paris is the capital of France.",
    "What is the capital of France?",
    "The Eiffel Tower is in Paris.",
    "You answer from the documents.",
    "hello world, hello agent memory",
]
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nDefault system.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|bos|>", "<|im_start|>", "<|im_end|>"]


def _train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture(scope="session")
def raw_tokenizer() -> Tokenizer:
    return _train()


@pytest.fixture(scope="session")
def chat_tokenizer(raw_tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Byte-level BPE with a ChatML-like template that injects a default system prompt."""
    return PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer, bos_token="<|bos|>", chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def plain_tokenizer(raw_tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Same vocabulary, no chat template."""
    return PreTrainedTokenizerFast(tokenizer_object=raw_tokenizer, bos_token="<|bos|>")


def postgres_url() -> str | None:
    # Tests only: CI sets this when it starts a real PostgreSQL (see tests/segments/POSTGRES.md).
    return os.environ.get("HYPIC_TEST_POSTGRES_URL") or None


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def registry_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty database: a SQLite file, or the PostgreSQL test database with our table dropped."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.sqlite3'}"
    url = postgres_url()
    if url is None:
        pytest.skip("HYPIC_TEST_POSTGRES_URL is not set")
    import sqlalchemy as sa

    from hypic_agent.segments.store.registry import Base

    engine = sa.create_engine(url)
    Base.metadata.drop_all(engine)
    engine.dispose()
    return url
