"""hypic-agent: position-independent segment caching (HYPIC) for hybrid-attention LLMs."""

__version__ = "0.1.0"
