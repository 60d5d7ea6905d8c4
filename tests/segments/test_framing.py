"""Per-kind framing, chat markup by difference, suffix."""

from __future__ import annotations

import pytest

from hypic_agent.segments.prompt.framing import FORMAT_VERSION, Framer
from hypic_agent.segments.prompt.kinds import Message, Segment


def test_format_version_is_an_int():
    assert isinstance(FORMAT_VERSION, int) and FORMAT_VERSION >= 1


@pytest.mark.parametrize(
    "kind, title, expected",
    [
        ("document", "Paris", "Document [Paris]\nParis is nice.\n\n"),
        ("document", None, "Document\nParis is nice.\n\n"),
        ("skill", "geo", "Skill [geo]\nParis is nice.\n\n"),
        ("memory", None, "Memory\nParis is nice.\n\n"),
        ("text", "ignored", "Paris is nice."),
    ],
)
def test_block_templates(chat_tokenizer, kind, title, expected):
    assert Framer(chat_tokenizer).frame(Segment(kind=kind, text="Paris is nice.", title=title)) == expected


def test_chat_markup_without_injected_default_system(chat_tokenizer):
    fr = Framer(chat_tokenizer)
    assert fr.has_chat_template
    turn = Segment(kind="turn", messages=(Message("user", "hi"), Message("assistant", "hello")))
    # the template injects "Default system." when a conversation opens without a system turn:
    # fragment framing must not carry it into the middle of a prompt
    assert fr.frame(turn) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    assert fr.frame(Segment(kind="system", text="Be brief.")) == "<|im_start|>system\nBe brief.<|im_end|>\n"
    assert fr.frame_suffix("Where?") == "<|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n"
    assert fr.frame_suffix(None) == "<|im_start|>assistant\n"


def test_fragments_concatenate_to_the_whole_conversation(chat_tokenizer):
    fr = Framer(chat_tokenizer)
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
    ]
    whole = chat_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    pieces = fr.frame_system("S") + fr.frame_messages([Message(**m) for m in msgs[1:3]]) + fr.frame_suffix("u2")
    assert pieces == whole


def test_plain_fallback(plain_tokenizer):
    fr = Framer(plain_tokenizer)
    assert not fr.has_chat_template
    turn = Segment(kind="turn", messages=(Message("user", "hi"), Message("assistant", "yo")))
    assert fr.frame(turn) == "user: hi\nassistant: yo\n"
    assert fr.frame(Segment(kind="system", text="Be brief.")) == "System: Be brief.\n\n"
    assert fr.frame_suffix("Where?") == "user: Where?\nassistant:"
    assert Framer(None).frame_suffix(None) == "assistant:"


def test_template_without_system_role(chat_tokenizer):
    class NoSystem:
        chat_template = "x"
        bos_token = "<s>"

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            if any(m["role"] == "system" for m in msgs):
                raise ValueError("System role not supported")
            body = "".join(f"<{m['role']}>{m['content']}</>" for m in msgs)
            return "<s>" + body + ("<assistant>" if add_generation_prompt else "")

    fr = Framer(NoSystem())  # type: ignore[arg-type]
    assert fr.frame(Segment(kind="system", text="S")) == "System: S\n\n"
    assert fr.frame_messages([Message("user", "q")]) == "<user>q</>"  # BOS stripped
    assert fr.frame_suffix("q") == "<user>q</><assistant>"
    assert fr.frame_suffix(None) == "<assistant>"


def test_framing_a_reference_is_an_error(chat_tokenizer):
    from hypic_agent.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="resolve it"):
        Framer(chat_tokenizer).frame(Segment(kind=None, ref="abc"))
