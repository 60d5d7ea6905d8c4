"""Grammar compilation with a compile cache, one ``Grammars`` per tokenizer.

``GrammarSpec`` says what to compile: ``json_object`` (any JSON object; with bounds, the bounded
one of ``bounds.json_object_schema``), ``json_schema`` (a JSON
Schema) or ``structural_tag`` (xgrammar's structural tag JSON: tool-call formats, see
``hypic_agent.tools.grammar``). JSON is compact (``", "`` and ``": "`` separators, no other
whitespace): a model cannot pad the output with whitespace until ``max_tokens``. A schema is
bounded before it is compiled (``bounds.py``: string lengths, digits, array items) so that a
model cannot stay inside one value until ``max_tokens`` either, and its key order is kept (the
source is the schema's JSON as given, not sorted: xgrammar writes properties in that order).

``Grammars.compile`` keeps the last ``max_entries`` compiled grammars (LRU, keyed by the spec), so
an agent that sends the same schema or tool catalogue on every call compiles it once; a schema
xgrammar rejects raises ``InvalidRequestError`` (400) naming ``param``. ``Grammars.factory`` gives
the per-request ``SamplingParams.constraint`` factory.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hypic_agent.errors import InvalidRequestError
from hypic_agent.runtime.constraints.bounds import JsonBounds, bound_schema, json_ebnf, json_object_schema
from hypic_agent.runtime.constraints.grammar import GrammarConstraint
from hypic_agent.runtime.constraints.tokenizer_info import tokenizer_info
from hypic_agent.runtime.sampling import TokenConstraint

_XGR_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[15:23:32] /project/cpp/x.cc:17: "
SpecKind = Literal["json_object", "json_schema", "structural_tag"]


@dataclass(frozen=True)
class GrammarSpec:
    kind: SpecKind
    source: str = ""  # canonical JSON of the schema / structural tag
    param: str = "response_format"  # the request field a compile error points at

    @classmethod
    def json_schema(
        cls, schema: Mapping[str, Any] | bool, param: str = "response_format", bounds: JsonBounds | None = None
    ) -> GrammarSpec:
        """``bounds``: rewrite the schema first (``bound_schema``); the key order is kept."""
        return cls("json_schema", json.dumps(bound_schema(schema, bounds)), param)

    @classmethod
    def json_object(cls, param: str = "response_format", bounds: JsonBounds | None = None) -> GrammarSpec:
        """Any JSON object; ``bounds``: its strings, numbers and arrays bounded (``json_object_schema``)."""
        return cls("json_object", json.dumps(json_object_schema(bounds)) if bounds is not None else "", param)

    @classmethod
    def structural_tag(cls, tag: Mapping[str, Any], param: str = "tool_choice") -> GrammarSpec:
        return cls("structural_tag", json.dumps(tag), param)


class Grammars:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...], max_entries: int = 256) -> None:
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.stop_ids = tuple(sorted(stop_ids))
        self._compiler = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, self.stop_ids), cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: GrammarSpec) -> Any:
        key = (spec.kind, spec.source)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self.misses += 1
            self._cache[key] = compiled
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec) -> Any:
        c = self._compiler
        try:
            if spec.kind == "json_object" and not spec.source:
                return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "json_object":
                return c.compile_grammar(json_ebnf(spec.source))
            if spec.kind == "json_schema":
                return c.compile_grammar(json_ebnf(spec.source))
            return c.compile_structural_tag(spec.source)
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's errors for schemas it cannot compile
            msg = _XGR_LOCATION.sub("", str(e)).strip()
            raise InvalidRequestError(f"cannot build a grammar from this schema: {msg}", param=spec.param) from e

    def factory(self, spec: GrammarSpec) -> Callable[[], TokenConstraint]:
        """Compile now (errors surface before decoding) and return the per-request factory."""
        compiled = self.compile(spec)
        vocab, stops = self.vocab_size, self.stop_ids
        return lambda: GrammarConstraint(compiled, vocab, stops)


_LOCK = threading.Lock()
_BY_TOKENIZER: dict[tuple[int, int, tuple[int, ...]], tuple[Any, Grammars]] = {}


def grammars_for(tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...], max_entries: int = 256) -> Grammars:
    """The ``Grammars`` of a tokenizer (one per tokenizer, vocab size and stop ids; built on first use)."""
    key = (id(tokenizer), int(vocab_size), tuple(sorted(stop_ids)))
    with _LOCK:
        hit = _BY_TOKENIZER.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        grammars = Grammars(tokenizer, vocab_size, stop_ids, max_entries)
        _BY_TOKENIZER[key] = (tokenizer, grammars)
        return grammars
