"""Agent with tools: memory, skills and the tool catalogue are all segments, cached and reused in any order.

Each task runs an agent loop over the OpenAI-compatible chat route: the model calls tools (the
first round must call one, ``tool_choice="required"``; later rounds choose), the example runs
them locally and sends the results back as ``tool`` messages, until the model answers. The
prompt is ``[system, tool catalogue (one segment per tool), skills, memory, turns...]``: the
catalogue comes from ``tools=``, skills and memory go in the ``segments`` extension. Between
tasks the tool list and the skills are shuffled and the memory grows, yet every tool and skill
segment is a cache hit wherever it now sits. Forced calls are decoded under the tools' schemas,
so their arguments always parse, even from the tiny random model CI runs this on.

    hypic-agent serve
    python examples/agent_tools.py
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from _common import ExampleFailure, banner, budget, client, parser, run, table
from hypic_client import Hypic, memory, skill

SYSTEM = "You are an operations agent. Use the tools to look things up or compute; then answer in one sentence."
EVENTS = {"launch review": "March 3", "design sync": "March 5", "retro": "March 9"}
UNITS = {"mile": 1609.344, "km": 1000.0, "m": 1.0}


def _calc(a: int, op: str, b: int) -> str:
    ops: dict[str, Callable[[int, int], float]] = {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "div": lambda x, y: x / y if y else float("nan"),
    }
    return str(ops[op](a, b))


def _convert(value: int, unit_from: str, unit_to: str) -> str:
    return f"{value * UNITS[unit_from] / UNITS[unit_to]:.3f} {unit_to}"


def _calendar(event: str) -> str:
    return f"{event}: {EVENTS[event]}"


def _int(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS: dict[str, tuple[dict[str, Any], Callable[..., str]]] = {
    "calculator": (
        _tool(
            "calculator",
            "Exact arithmetic on two integers.",
            {"a": _int(-9999, 9999), "op": {"enum": ["add", "sub", "mul", "div"]}, "b": _int(-9999, 9999)},
        ),
        _calc,
    ),
    "convert_length": (
        _tool(
            "convert_length",
            "Convert a length between units.",
            {"value": _int(0, 100000), "unit_from": {"enum": list(UNITS)}, "unit_to": {"enum": list(UNITS)}},
        ),
        _convert,
    ),
    "calendar": (_tool("calendar", "The date of a team event.", {"event": {"enum": list(EVENTS)}}), _calendar),
}
SKILLS = {
    "estimates": "Skill: estimates. When a task mixes units, convert everything to kilometres first, "
    "then compute with the calculator; round to whole numbers in the answer.",
    "scheduling": "Skill: scheduling. Dates of team events come from the calendar tool, never from memory; "
    "say the weekday only if the calendar gives it.",
}
TASKS = [
    "How many kilometres are 26 miles?",
    "When is the launch review, and how many days after March 1 is it?",
    "What is 17 times 23?",
]


def run_tool(call: Any) -> str:
    name = call.function.name
    if name not in TOOLS:
        return f"error: no tool {name!r}"
    try:
        return TOOLS[name][1](**call.function.parsed_arguments())
    except (TypeError, ValueError, KeyError) as e:  # a model's bad arguments are the tool's error message
        return f"error: {e}"


def agent_task(hypic: Hypic, task: str, facts: list[str], rng: random.Random, args: Any, rounds: int) -> dict:
    """One task's loop; returns what the table shows."""
    tools = [spec for spec, _ in TOOLS.values()]
    rng.shuffle(tools)
    skills = [skill(text, name) for name, text in SKILLS.items()]
    rng.shuffle(skills)
    notes = memory("\n".join(f"- {f}" for f in facts) or "(no notes yet)", "agent_notes.md")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    calls, cached, prompt, answer = 0, 0, 0, ""
    for r in range(rounds):
        last = r == rounds - 1
        resp = hypic.chat.completions.create(
            messages=messages,
            tools=tools,
            tool_choice="required" if r == 0 else ("none" if last else "auto"),
            parallel_tool_calls=False,
            segments=[*skills, notes],
            max_tokens=args.call_tokens if r == 0 else args.max_tokens,
            temperature=0.0,
            **({"mode": args.mode} if args.mode else {}),
        )
        usage = resp.usage
        if usage is not None:
            cached += usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
            prompt += usage.prompt_tokens
        msg = resp.choices[0].message
        if not msg.tool_calls:
            answer = msg.content if isinstance(msg.content, str) else ""
            break
        if r == 0 and resp.choices[0].finish_reason != "tool_calls":
            raise ExampleFailure(f"{task!r}: the forced first round returned no parsed tool call")
        done = [c.model_dump() for c in msg.tool_calls]
        messages.append({"role": "assistant", "content": msg.content, "tool_calls": done})
        for c in msg.tool_calls:
            calls += 1
            messages.append({"role": "tool", "tool_call_id": c.id, "content": run_tool(c)})
    facts.append(f"{task} -> {' '.join(answer.split())[:60] or '(no answer)'}")
    return {"task": task, "rounds": r + 1, "calls": calls, "cached": cached, "prompt": prompt, "answer": answer}


def main() -> None:
    p = parser(__doc__.splitlines()[0], limit=len(TASKS), max_tokens=64)
    p.add_argument("--call-tokens", type=int, default=160, help="token budget of a forced tool-call round")
    p.add_argument("--rounds", type=int, default=3, help="model calls per task at most")
    args = p.parse_args()
    b = budget(args, smoke_limit=2)
    args.max_tokens = b.max_tokens
    rng, facts, rows = random.Random(0), [], []
    with client(args) as hypic:
        banner("agent_tools", f"{min(b.limit, len(TASKS))} agent tasks with {len(TOOLS)} tools against {args.url}")
        for i, task in enumerate(TASKS[: b.limit]):
            out = agent_task(hypic, task, facts, rng, args, args.rounds)
            if i > 0 and args.mode not in ("full_recompute", "prefix_cache") and out["cached"] == 0:
                raise ExampleFailure(f"task {i + 1}: the tool catalogue and skills were not served from the cache")
            rows.append([i + 1, task, out["rounds"], out["calls"], out["cached"], out["prompt"], out["answer"] or "-"])
    print(table(["task", "question", "rounds", "calls", "cached", "prompt", "answer"], rows, [4, 48, 6, 5, 7, 7, 50]))
    share = sum(r[4] for r in rows) / max(sum(r[5] for r in rows), 1)
    n_calls = sum(r[3] for r in rows)
    print(f"OK agent_tools: {len(rows)} tasks, {n_calls} tool calls, {share:.0%} of prompt tokens cached")


if __name__ == "__main__":
    run(main)
