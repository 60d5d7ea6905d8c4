"""Agent memory: skills, memory files and conversation turns across a multi-step agent loop.

The agent's prompt at every step is ``[system, skills..., memory files..., earlier turns...]`` and
the user's message as the query. Skills are stored once (``segments.put``, pinned) and sent by id;
memory files are rewritten between steps (a ``Remember:`` message adds a fact to the profile, every
step appends to the session log); each earlier message is its own ``turn`` segment. So from step to
step only the changed memory files and the newest turns are recomputed; skills, the system prompt
and older turns come from the cache wherever they now sit.

    hypic-agent serve
    python examples/agent_memory.py
"""

from __future__ import annotations

from dataclasses import dataclass, field

from _common import ExampleFailure, banner, budget, client, gen_kwargs, parser, require_answer, run, table
from hypic_client import Hypic, Segment, memory, ref, skill, system, turn

SYSTEM = system(
    "You are a helpful assistant. Use the user profile and session log to remember facts about the user. "
    "The skills list the tools you can use. Answer briefly."
)
SKILLS = {
    "calculator": "Skill: calculator. Evaluates arithmetic such as 17 * 23 or (4 + 5) / 3 exactly. "
    "Use it whenever the user asks to add, subtract, multiply or divide numbers.",
    "unit_converter": "Skill: unit_converter. Converts between units of length, mass and temperature, "
    "for example miles to kilometres (1 mile = 1.609 km) or Fahrenheit to Celsius.",
    "calendar": "Skill: calendar. Looks up, creates and moves events in the user's calendar, "
    "for example meetings, reviews and deadlines with their dates.",
}
STEPS: list[tuple[str, list[str]]] = [  # (user message, words of which a good answer mentions all)
    ("Remember: my name is Ada and I lead the Orion project.", []),
    ("Which skill should I use to convert 5 miles to kilometres?", ["converter"]),
    ("Remember: the Orion launch review is on March 3.", []),
    ("What is my name, and when is the Orion launch review?", ["Ada", "March 3"]),
    ("Which skill helps me compute 17 times 23?", ["calculator"]),
]
NO_REUSE_MODES = ("full_recompute", "prefix_cache")


@dataclass
class AgentState:
    """The agent's memory files and conversation, rebuilt into segments at every step."""

    profile: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    messages: list[tuple[str, str]] = field(default_factory=list)
    max_turns: int = 8

    def segments(self, skill_ids: list[str]) -> tuple[list[Segment], list[str]]:
        """The prompt segments and a label for each (to read the per-segment usage)."""
        profile = "# user_profile.md\n" + ("\n".join(f"- {f}" for f in self.profile) or "(nothing known yet)")
        log = "# session_log.md\n" + ("\n".join(self.log) or "(new session)")
        history = self.messages[-self.max_turns :]
        segs = [SYSTEM, *(ref(i) for i in skill_ids), memory(profile, "user_profile.md"), memory(log, "session_log.md")]
        segs += [turn(role, content) for role, content in history]
        labels = ["system", *SKILLS, "user_profile.md", "session_log.md"]
        labels += [f"turn:{role}" for role, _ in history]
        return segs, labels

    def remember(self, step: int, user: str, answer: str) -> None:
        """The agent's memory write between steps: facts to the profile, one line to the log."""
        if user.lower().startswith("remember:"):
            self.profile.append(user.split(":", 1)[1].strip())
        self.log.append(f"- step {step}: user asked {user!r}; I answered {' '.join(answer.split())[:80]!r}")
        self.messages += [("user", user), ("assistant", answer)]


def store_skills(hypic: Hypic) -> list[str]:
    infos = hypic.segments.put([skill(text, name, pin=True) for name, text in SKILLS.items()])
    if len(infos) != len(SKILLS) or not all(i.id for i in infos):
        raise ExampleFailure(f"segments.put returned {len(infos)} entries for {len(SKILLS)} skills")
    return [i.id for i in infos]


def main() -> None:
    args = parser(__doc__.splitlines()[0], limit=len(STEPS), max_tokens=48).parse_args()
    b = budget(args, smoke_limit=3)
    state, rows = AgentState(), []
    with client(args) as hypic:
        banner("agent_memory", f"{min(b.limit, len(STEPS))} agent steps against {args.url}")
        skill_ids = store_skills(hypic)
        for step, (user, expect) in enumerate(STEPS[: b.limit], 1):
            segments, labels = state.segments(skill_ids)
            resp = hypic.generate(segments, user, **gen_kwargs(args, b.max_tokens))
            answer = require_answer(resp.text, f"step {step}", smoke=args.smoke)
            u = resp.usage
            if args.mode not in NO_REUSE_MODES and step > 1 and u.cached_tokens == 0:
                raise ExampleFailure(f"step {step}: skills and earlier turns were not served from the cache")
            named = len(u.segments) == len(labels)
            missed = [labels[i] if named else s.kind for i, s in enumerate(u.segments) if not s.hit]
            recalled = "-" if not expect else "yes" if all(w.lower() in answer.lower() for w in expect) else "no"
            rows.append(
                [
                    step,
                    user,
                    f"{sum(s.hit for s in u.segments)}/{len(u.segments)}",
                    ", ".join(missed) or "-",
                    u.cached_tokens,
                    u.recomputed_tokens,
                    f"{resp.timings.ttft_ms or 0:.0f}",
                    recalled,
                    answer,
                ]
            )
            state.remember(step, user, answer)
    headers = ["step", "user", "hits", "recomputed segments", "cached", "recomp", "ttft_ms", "recalled", "answer"]
    print(table(headers, rows, [4, 34, 5, 62, 6, 6, 7, 8, 50]))
    print(f"final memory: {len(state.profile)} profile facts, {len(state.log)} log lines, {len(state.messages)} turns")
    cached = sum(r[4] for r in rows) / max(sum(r[4] + r[5] for r in rows), 1)
    asked = [r[7] for r in rows if r[7] != "-"]
    on_topic = f"{asked.count('yes')}/{len(asked)} answers used the memory/skills"
    print(f"OK agent_memory: {len(rows)} steps, {cached:.0%} of prompt tokens cached, {on_topic}")


if __name__ == "__main__":
    run(main)
