"""Structured-output constraints: xgrammar behind the engine's ``TokenConstraint`` protocol.

* ``tokenizer_info.py``: xgrammar's view of one of our tokenizers (special tokens blanked);
* ``bounds.py``: ``JsonBounds`` and ``bound_schema``, the schema rewrite that bounds string
  lengths, digits and array items so a grammar ends (Settings ``grammar_max_*``);
* ``compiler.py``: ``GrammarSpec`` (json_object / json_schema / structural_tag) and ``Grammars``,
  the per-tokenizer compiler with its compile cache;
* ``grammar.py``: ``GrammarConstraint``, the per-request matcher (mask, accept, finished);
* ``factory.py``: ``GrammarFactory``, the per-request constraint factory that pickles as its spec
  (bound to a compiled grammar again in the engine process).

Why xgrammar (and not llguidance or outlines-core): ``benchmarks/grammar.py`` and docs/api.md.
"""

from hypic_agent.runtime.constraints.bounds import JsonBounds, bound_schema, json_ebnf
from hypic_agent.runtime.constraints.compiler import Grammars, GrammarSpec, grammars_for
from hypic_agent.runtime.constraints.factory import GrammarFactory
from hypic_agent.runtime.constraints.grammar import GrammarConstraint

__all__ = [
    "GrammarConstraint",
    "GrammarFactory",
    "GrammarSpec",
    "Grammars",
    "JsonBounds",
    "bound_schema",
    "grammars_for",
    "json_ebnf",
]
