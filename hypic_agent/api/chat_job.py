"""A validated chat request -> a ``GenerateJob`` with its output controls (grammar, top logprobs).

Everything a chat request can get wrong is checked here, before the engine runs: the model name
(404), ``top_logprobs`` without ``logprobs``, the tool setup, the grammar (a schema xgrammar
cannot compile is a 400). The grammar comes from ``response_format`` or, for ``tool_choice``
``required`` / a named function, from the functions' schemas (``tools/grammar.py``); either is
bounded by the ``grammar_max_*`` settings so it ends (``runtime/constraints/bounds.py``; a tool
call's strings only with ``grammar_max_tool_string_length``, so its arguments keep escapes), and
a forced call's constraint also ends on a repeated call (``ForcedCalls``). The tool catalogue goes
into the prompt as segments (``tools/catalogue.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from hypic_agent.api import service
from hypic_agent.api.chat import ChatRequest, chat_to_segments
from hypic_agent.api.served import check_model
from hypic_agent.api.state import ServerState
from hypic_agent.api.tool_schemas import response_spec, tool_setup
from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.constraints import GrammarFactory, Grammars, GrammarSpec, JsonBounds, grammars_for
from hypic_agent.runtime.sampling import SamplingParams
from hypic_agent.tools.catalogue import with_tools
from hypic_agent.tools.format import ToolFormat
from hypic_agent.tools.grammar import call_grammar
from hypic_agent.tools.spec import ToolSetup


@dataclass
class ChatJob:
    job: service.GenerateJob
    tools: ToolSetup
    fmt: ToolFormat


@lru_cache(maxsize=8)
def tool_format(tokenizer: Any) -> ToolFormat:
    return ToolFormat.of(tokenizer)


def grammars(st: ServerState) -> Grammars:
    e = st.engine
    return grammars_for(e.tokenizer, st.vocab_size, e.eos_ids, st.settings.grammar_cache_size)


def with_output_controls(
    st: ServerState, sampling: SamplingParams, spec: GrammarSpec | None, top_logprobs: int
) -> SamplingParams:
    """``sampling`` with the grammar (compiled now: a 400 before anything runs; a ``GrammarFactory``, so
    it also reaches an engine process) and the number of top logprobs per token."""
    factory = GrammarFactory(spec).bind(grammars(st), st.engine.tokenizer) if spec is not None else None
    return replace(sampling, constraint=factory, top_logprobs=top_logprobs).validate()


def check_top_logprobs(top_logprobs: int | None, logprobs: bool | None) -> int:
    if top_logprobs and not logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    return top_logprobs or 0


def prepare_chat(st: ServerState, req: ChatRequest, tenant: str) -> ChatJob:
    check_model(st, req.model)
    top = check_top_logprobs(req.top_logprobs, req.logprobs)
    fmt = tool_format(st.engine.tokenizer)
    setup = tool_setup(req.tools, req.tool_choice, req.parallel_tool_calls)
    bounds = JsonBounds.of(st.settings)
    spec = response_spec(req.response_format, bounds)
    if setup.choice.forces_call:
        if spec is not None:
            raise InvalidRequestError(
                "tool_choice forces a tool call and response_format asks for JSON: use one of them",
                param="response_format",
            )
        tool_bounds = JsonBounds.for_tool_calls(st.settings)  # arguments keep escapes; numbers stay bounded
        tag = call_grammar(setup, fmt.syntax, tool_bounds, st.settings.max_parallel_tool_calls)
        spec = GrammarSpec.structural_tag(tag, param="tools")
    segments, query = chat_to_segments(req, fmt)
    segments = with_tools(segments, setup.functions, st.framer, fmt)
    sampling = with_output_controls(st, SamplingParams(), spec, top)  # compile (and fail) before planning
    constraint = sampling.constraint
    if isinstance(constraint, GrammarFactory) and setup.choice.forces_call:
        constraint = constraint.with_forced_calls()  # ends on a repeated call (tools.grammar.ForcedCalls)
    job = service.prepare_job(st, req.to_sampling(), segments, query, tenant)
    st.admit_prompt(job.plan, job.mode, job.seam, tenant, job.sampling.max_tokens)  # 413 / 429 before any build
    job.sampling = replace(job.sampling, constraint=constraint, top_logprobs=top).validate()
    return ChatJob(job, setup, fmt)
