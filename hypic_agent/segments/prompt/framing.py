"""Per-kind framing: a ``Segment`` becomes the exact text that is tokenized for it.

Templates (``FORMAT_VERSION`` changes whenever any output here changes, so cached
entries framed the old way can never be hit):

* ``system``: the chat template's system message when the tokenizer has one, else ``"System: {text}\\n\\n"``
* ``document`` / ``skill`` / ``memory``: ``"Document [title]\\n{text}\\n\\n"`` (``"Document\\n{text}\\n\\n"``
  without a title; ``Skill`` / ``Memory`` likewise)
* ``text``: verbatim
* ``turn``: the chat template's markup for those messages, else ``"role: content\\n"`` per message
* suffix (never cached): the final user turn + the assistant generation prompt.

NOTE: chat templates are rendered for a fragment of a conversation by difference: render
``[anchor] + messages`` and ``[anchor]`` and keep what the messages added. The anchor is a
system message, so templates that inject a default system prompt (or a BOS token) when the
conversation does not open with one add it to both renders and it cancels out. The BOS is a
piece of its own at the start of the prompt (see ``tokenize.py``), never part of a segment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hypic_agent.errors import InvalidRequestError
from hypic_agent.segments.prompt.kinds import Message, Segment

FORMAT_VERSION = 1
"""Bump on any change to the text produced here (it is part of every ``SegmentKey``)."""

_HEADERS = {"document": "Document", "skill": "Skill", "memory": "Memory"}
_ANCHOR = {"role": "system", "content": "hypic-anchor"}


class ChatTokenizer(Protocol):
    """What framing needs from a tokenizer (a transformers tokenizer fits). Optional
    attributes read when present: ``chat_template`` (falsy: plain framing), ``bos_token``."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def header_block(kind: str, text: str, title: str | None) -> str:
    """``Document [title]\\n{text}\\n\\n`` for document / skill / memory."""
    head = _HEADERS[kind]
    if title:
        head = f"{head} [{title}]"
    return f"{head}\n{text}\n\n"


def plain_messages(messages: Sequence[Message | Mapping[str, Any]]) -> str:
    """Fallback chat rendering: one ``role: content`` line per message."""
    return "".join(f"{_role(m)}: {_content(m)}\n" for m in messages)


class Framer:
    """Frames segments and the suffix for one tokenizer (its chat template, if any).

    ``chat_template_kwargs`` go to every ``apply_chat_template`` call (e.g.
    ``{"enable_thinking": False}`` for Qwen3); they change the framing, so they belong in the
    model fingerprint the caller uses for keys.
    """

    def __init__(self, tokenizer: ChatTokenizer | None, chat_template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.has_chat_template = bool(tokenizer is not None and getattr(tokenizer, "chat_template", None))
        self._system_ok: bool | None = None

    # ------------------------------------------------------------------ segments
    def frame(self, segment: Segment) -> str:
        """The text of one segment (by content; references are resolved before framing)."""
        if segment.ref is not None:
            raise InvalidRequestError(
                "a segment given by id is framed when stored; resolve it before framing", param="id"
            )
        kind = segment.kind
        if kind == "turn":
            assert segment.messages is not None
            return self.frame_messages(segment.messages)
        assert segment.text is not None
        if kind == "text":
            return segment.text
        if kind == "system":
            return self.frame_system(segment.text)
        return header_block(kind or "", segment.text, segment.title)

    def frame_system(self, text: str) -> str:
        if self.has_chat_template and self._supports_system():
            return self._render_fragment([{"role": "system", "content": text}], anchor=False)
        return f"System: {text}\n\n"

    def frame_messages(self, messages: Sequence[Message | Mapping[str, str]]) -> str:
        """Chat markup for a run of messages in the middle of a conversation."""
        msgs = [_as_dict(m) for m in messages]
        if self.has_chat_template:
            return self._render_fragment(msgs, anchor=True)
        return plain_messages(msgs)

    # ------------------------------------------------------------------ suffix
    def frame_suffix(self, query: str | None) -> str:
        """Final user turn (when ``query`` is non-empty) + the assistant generation prompt."""
        msgs = [{"role": "user", "content": query}] if query else []
        if self.has_chat_template:
            return self._render_fragment(msgs, anchor=True, generation_prompt=True)
        return plain_messages(msgs) + "assistant:"

    def render_conversation(self, msgs: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
        """The template's text for a whole conversation from its start (BOS stripped), with the
        ``tools`` list passed to the template (tool catalogues: ``hypic_agent/tools/catalogue.py``)."""
        return self._strip_bos(self._render([dict(m) for m in msgs], tools=tools))

    # ------------------------------------------------------------------ internals
    def _render(self, msgs: list[dict[str, Any]], generation_prompt: bool = False, tools: Any = None) -> str:
        assert self.tokenizer is not None
        extra = {"tools": list(tools)} if tools else {}
        out = self.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=generation_prompt, **extra, **self.kwargs
        )
        if not isinstance(out, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(out).__name__}, not str")
        return out

    def _render_fragment(self, msgs: list[dict[str, Any]], *, anchor: bool, generation_prompt: bool = False) -> str:
        """What ``msgs`` add to a conversation (see the module NOTE)."""
        if not msgs and generation_prompt:
            # generation prompt alone: the difference made by add_generation_prompt
            base = [_ANCHOR] if self._supports_system() else []
            base.append({"role": "user", "content": "hypic-anchor"})
            return _difference(self._render(base), self._render(base, generation_prompt=True))
        if anchor and self._supports_system():
            base_text = self._render([_ANCHOR])
            full = self._render([_ANCHOR, *msgs], generation_prompt)
            if full.startswith(base_text):
                return full[len(base_text) :]
        return self._strip_bos(self._render(msgs, generation_prompt))

    def _supports_system(self) -> bool:
        """Some templates (Gemma) raise on a system message; probe once."""
        if self._system_ok is None:
            try:
                self._render([_ANCHOR])
                self._system_ok = True
            except Exception:
                self._system_ok = False
        return self._system_ok

    def _strip_bos(self, text: str) -> str:
        bos = getattr(self.tokenizer, "bos_token", None)
        if isinstance(bos, str) and bos and text.startswith(bos):
            return text[len(bos) :]
        return text


def _difference(base: str, full: str) -> str:
    if not full.startswith(base):
        raise ValueError("chat template output is not append-only; cannot frame a fragment")
    return full[len(base) :]


def _as_dict(m: Message | Mapping[str, str]) -> dict[str, Any]:
    """A message for the template; an assistant's calls as OpenAI ``tool_calls`` with parsed arguments."""
    out: dict[str, Any] = {"role": _role(m), "content": _content(m)}
    calls = m.tool_calls if isinstance(m, Message) else ()
    if calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": json.loads(args)}} for name, args in calls
        ]
    return out


def _role(m: Message | Mapping[str, str]) -> str:
    return m.role if isinstance(m, Message) else m["role"]


def _content(m: Message | Mapping[str, str]) -> str:
    return m.content if isinstance(m, Message) else m["content"]
