"""How a model sees tools and writes calls: its chat template's format, or our default one.

``ToolFormat.of(tokenizer)`` decides once per tokenizer:

* ``template_tools``: the chat template renders a ``tools`` list itself (Qwen3.5, Qwen3-Next and
  other Qwen templates): the catalogue is rendered by the template (``catalogue.py``), assistant
  calls in the history are passed to it as ``tool_calls``;
* ``syntax``: how the model writes a call. ``qwen_xml`` when the template speaks Qwen's XML
  parameter format (Qwen3.5: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n
  </parameter>\\n</function>\\n</tool_call>``), else ``json``: ``<tool_call>\\n{"name": NAME,
  "arguments": {...}}\\n</tool_call>`` (Qwen3 / Qwen3-Next, and our default format).

The default format, for templates without tools (SmolLM2, the tiny models' ChatML) and
tokenizers without a template: a ``system`` segment with ``DEFAULT_INSTRUCTIONS`` after the
request's own system segments, then one segment per function, ``Tool NAME\\n{json}\\n\\n``; calls
in the history are written into the assistant message's text in the ``json`` syntax above.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from hypic_agent.tools.spec import Function

Syntax = Literal["json", "qwen_xml"]

DEFAULT_INSTRUCTIONS = (
    "# Tools\n\n"
    "You can call functions. Each one is described in a Tool block below: its name, what it does "
    "and the JSON schema of its arguments.\n\n"
    "To call functions, answer with one block per call, and nothing else:\n"
    "<tool_call>\n"
    '{"name": "<function name>", "arguments": <the arguments as a JSON object>}\n'
    "</tool_call>\n"
    "A function's result comes back in a message from the tool; then answer the user."
)
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolFormat:
    template_tools: bool = False
    syntax: Syntax = "json"

    @classmethod
    def of(cls, tokenizer: Any) -> ToolFormat:
        template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
        if not isinstance(template, str) or not re.search(r"\btools\b", template):
            return cls()
        return cls(template_tools=True, syntax="qwen_xml" if "<function=" in template else "json")


def tool_block(function: Function) -> str:
    """The default format's segment text for one function."""
    fn = function.openai()["function"]
    return f"Tool {function.name}\n{json.dumps(fn, ensure_ascii=False)}\n\n"


def call_text(name: str, arguments: Any, syntax: Syntax = "json") -> str:
    """One call written the way the model writes it (``arguments``: a dict or its JSON text)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    if syntax == "json":
        body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
        for k, v in (args or {}).items()
    )
    return f"{CALL_OPEN}\n<function={name}>\n{params}</function>\n{CALL_CLOSE}"
