"""LlamaIndex adapters (``pip install 'hypic-client[llamaindex]'``).

* :class:`HypicRetriever`: wraps a retriever (or fixed nodes), stores each retrieved node as a
  server segment and returns ``NodeWithScore`` tagged with ``metadata["hypic_segment_id"]``
  (kept out of the LLM/embedding text).
* :class:`HypicLLM`: a ``CustomLLM`` with ``complete``/``stream_complete`` (prompt -> query) and a
  native ``chat``/``stream_chat`` that sends messages as segments; bound ``documents`` (nodes,
  strings, segments) go first, tagged nodes by id.
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("hypic_client.llamaindex needs llama-index-core: pip install 'hypic-client[llamaindex]'") from e

from .._adapters import SEGMENT_ID_KEY, TOKENS_KEY
from ._convert import node_to_segment, nodes_to_segments
from ._llm import HypicLLM
from ._retriever import HypicRetriever

__all__ = ["SEGMENT_ID_KEY", "TOKENS_KEY", "HypicLLM", "HypicRetriever", "node_to_segment", "nodes_to_segments"]
