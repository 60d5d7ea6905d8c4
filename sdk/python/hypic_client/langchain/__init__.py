"""LangChain adapters (``pip install 'hypic-client[langchain]'``).

* :class:`HypicRetriever`: wraps a retriever (or a fixed list of Documents), stores what it
  returns as server segments and tags each Document with ``metadata["hypic_segment_id"]``.
* :class:`ChatHypic`: a chat model; system messages -> ``system`` segments, bound documents ->
  ``document`` segments (by id when tagged), turns -> ``turn`` segments, last user message -> query.
  Cache reads are reported in ``usage_metadata["input_token_details"]["cache_read"]``.
"""

try:
    import langchain_core  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("hypic_client.langchain needs langchain-core: pip install 'hypic-client[langchain]'") from e

from .._adapters import SEGMENT_ID_KEY, TOKENS_KEY
from ._chat import ChatHypic
from ._convert import document_to_segment, documents_to_segments, messages_to_plan
from ._retriever import HypicRetriever

__all__ = [
    "SEGMENT_ID_KEY",
    "TOKENS_KEY",
    "ChatHypic",
    "HypicRetriever",
    "document_to_segment",
    "documents_to_segments",
    "messages_to_plan",
]
