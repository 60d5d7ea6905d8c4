"""Tool catalogues as segments: the default format, and a chat template's own tools block cut per tool."""

from __future__ import annotations

import json

import pytest

from hypic_agent.api.chat import ChatRequest, chat_to_segments
from hypic_agent.runtime.models.loading.tokenizer import tiny_tokenizer
from hypic_agent.segments.prompt.framing import Framer
from hypic_agent.segments.prompt.kinds import Segment
from hypic_agent.tools.catalogue import with_tools
from hypic_agent.tools.format import DEFAULT_INSTRUCTIONS, ToolFormat
from hypic_agent.tools.spec import Function

# a template in the Qwen style (tools inside the system turn, one JSON line per tool), written for this test
TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif %}"
    "{{ 'Functions:\\n<tools>' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\nCall them in <tool_call></tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}{% if m.role != 'system' or not loop.first %}"
    "{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls or [] %}"
    "{{ '\\n<tool_call>\\n' + ({'name': c.function.name, 'arguments': c.function.arguments} | tojson) }}"
    "{{ '\\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
A = Function("get_time", "Time in a zone", {"type": "object", "properties": {"zone": {"type": "string"}}})
B = Function("add", "Add two numbers", {"type": "object", "properties": {"a": {"type": "number"}}})
SYSTEM = Segment(kind="system", text="You are an agent.")


@pytest.fixture(scope="module")
def tools_tok():
    tok = tiny_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def test_default_format_one_segment_per_tool(tools_tok):
    framer = Framer(tiny_tokenizer())
    fmt = ToolFormat.of(framer.tokenizer)
    assert fmt == ToolFormat(template_tools=False, syntax="json")
    out = with_tools([SYSTEM], [A, B], framer, fmt)
    assert [s.text for s in out[:2]] == [SYSTEM.text, DEFAULT_INSTRUCTIONS]
    assert [s.title for s in out[2:]] == ["get_time", "add"]
    assert out[2].text is not None and out[2].text.startswith("Tool get_time\n{")
    assert json.loads(out[2].text.split("\n")[1])["parameters"] == {
        "type": "object",
        "properties": {"zone": {"type": "string"}},
    }


def test_template_block_is_cut_per_tool_and_pieces_do_not_depend_on_order(tools_tok):
    framer = Framer(tools_tok)
    fmt = ToolFormat.of(tools_tok)
    assert fmt.template_tools and fmt.syntax == "json"
    ab = with_tools([SYSTEM], [A, B], framer, fmt)
    ba = with_tools([SYSTEM], [B, A], framer, fmt)
    assert len(ab) == 4 and all(s.kind == "text" for s in ab)  # head, A, B, tail
    full = tools_tok.apply_chat_template(
        [{"role": "system", "content": SYSTEM.text}], tools=[A.openai(), B.openai()], tokenize=False
    )
    assert "".join(s.text or "" for s in ab) == full
    assert ab[0].text == ba[0].text and ab[3].text == ba[3].text
    assert (ab[1].text, ab[2].text) == (ba[2].text, ba[1].text)
    assert ab[1].text is not None and json.loads(ab[1].text)["function"]["name"] == "get_time"


def test_history_calls_go_to_the_template_or_into_the_text(tools_tok):
    req = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "time?"},
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}],
                },
                {"role": "tool", "content": "12:00"},
                {"role": "user", "content": "thanks"},
            ]
        }
    )
    templated, _ = chat_to_segments(req, ToolFormat.of(tools_tok))
    msg = templated[1].messages[0]  # type: ignore[index]
    assert msg.content == "" and msg.tool_calls == (("get_time", '{"zone": "utc"}'),)
    framed = Framer(tools_tok).frame(templated[1])
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call><|im_end|>' in framed
    default, query = chat_to_segments(req, ToolFormat())
    assert (
        default[1].messages[0].content
        == '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    )  # type: ignore[index]
    assert default[2].messages[0].role == "tool" and query == "thanks"  # type: ignore[index]
