"""``GrammarFactory``: a ``SamplingParams.constraint`` that can cross a process boundary.

A compiled xgrammar grammar cannot be pickled, and a request's sampling parameters travel from the
API process to the engine process (``runtime.core_process``). The factory holds the ``GrammarSpec``
(and whether a forced tool call ends on a repeated call, ``tools.grammar.ForcedCalls``) and the
grammar compiled in *this* process (``bind``); pickled, only the spec goes, and the other process
binds it to its own ``Grammars`` (compile cache) before the request is queued. The API binds it too,
so a schema xgrammar rejects is a 400 before anything is sent."""

from __future__ import annotations

from typing import Any

from hypic_agent.runtime.constraints.compiler import Grammars, GrammarSpec
from hypic_agent.runtime.constraints.grammar import GrammarConstraint
from hypic_agent.runtime.sampling import TokenConstraint


class GrammarFactory:
    def __init__(self, spec: GrammarSpec, *, forced_calls: bool = False) -> None:
        self.spec = spec
        self.forced_calls = forced_calls
        self._compiled: Any = None
        self._vocab = 0
        self._stops: tuple[int, ...] = ()
        self._tokenizer: Any = None

    @property
    def bound(self) -> bool:
        return self._compiled is not None

    def bind(self, grammars: Grammars, tokenizer: Any) -> GrammarFactory:
        """Compile the spec with ``grammars`` (cached there; raises ``InvalidRequestError`` for a schema
        xgrammar rejects); ``tokenizer`` follows the text of a forced call. Returns ``self``."""
        self._compiled = grammars.compile(self.spec)
        self._vocab, self._stops = grammars.vocab_size, grammars.stop_ids
        self._tokenizer = tokenizer
        return self

    def with_forced_calls(self) -> GrammarFactory:
        """The same grammar (compiled once) as a forced tool call's: decoding also ends on a repeated call."""
        out = GrammarFactory(self.spec, forced_calls=True)
        out._compiled, out._vocab, out._stops = self._compiled, self._vocab, self._stops
        out._tokenizer = self._tokenizer
        return out

    def __call__(self) -> TokenConstraint:
        if self._compiled is None:
            raise RuntimeError("GrammarFactory.bind() was not called in this process")
        inner = GrammarConstraint(self._compiled, self._vocab, self._stops)
        if not self.forced_calls:
            return inner
        from hypic_agent.tools.grammar import ForcedCalls  # tools builds on runtime.constraints

        return ForcedCalls(inner, self._tokenizer)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "forced_calls": self.forced_calls}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], forced_calls=state["forced_calls"])  # type: ignore[misc]
