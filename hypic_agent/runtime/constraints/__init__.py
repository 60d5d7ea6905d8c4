"""Structured-output constraints: xgrammar behind the engine's ``TokenConstraint`` protocol.

* ``tokenizer_info.py``: xgrammar's view of one of our tokenizers (special tokens blanked);
* ``compiler.py``: ``GrammarSpec`` (json_object / json_schema / structural_tag) and ``Grammars``,
  the per-tokenizer compiler with its compile cache;
* ``grammar.py``: ``GrammarConstraint``, the per-request matcher (mask, accept, finished).

Why xgrammar (and not llguidance or outlines-core): ``benchmarks/grammar.py`` and docs/api.md.
"""

from hypic_agent.runtime.constraints.compiler import Grammars, GrammarSpec, grammars_for
from hypic_agent.runtime.constraints.grammar import GrammarConstraint

__all__ = ["GrammarConstraint", "GrammarSpec", "Grammars", "grammars_for"]
