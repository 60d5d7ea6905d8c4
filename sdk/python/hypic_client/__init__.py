"""hypic-client: Python client of the hypic-agent server (position-independent segment caching).

```python
from hypic_client import Hypic, doc, system, turn

with Hypic("http://127.0.0.1:8000") as client:
    resp = client.generate(
        segments=[system("Answer from the documents."), doc("Paris is the capital of France.", title="Paris")],
        query="What is the capital of France?",
        max_tokens=32,
    )
    print(resp.text, resp.usage.cached_tokens, resp.timings.ttft_ms)
```

Adapters live in ``hypic_client.langchain`` and ``hypic_client.llamaindex`` (optional extras).
"""

from ._async_client import AsyncHypic
from ._chat_stream import AsyncChatCompletionStream, ChatCompletionStream
from ._client import Hypic
from ._errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APIStreamError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    HypicError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
)
from ._models import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    FunctionCall,
    GenerateChunk,
    GenerateResponse,
    Health,
    Model,
    ModelList,
    SegmentDeleted,
    SegmentInfo,
    SegmentPage,
    SegmentUsage,
    Timings,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from ._segments import (
    CachePolicy,
    Message,
    Segment,
    SegmentKind,
    SegmentLike,
    doc,
    memory,
    ref,
    skill,
    system,
    text,
    turn,
    turns,
)
from ._streaming import AsyncGenerateStream, AsyncStream, GenerateStream, ServerSentEvent, Stream
from ._version import __version__

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APIStreamError",
    "APITimeoutError",
    "AsyncChatCompletionStream",
    "AsyncGenerateStream",
    "AsyncHypic",
    "AsyncStream",
    "AuthenticationError",
    "BadRequestError",
    "CachePolicy",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionStream",
    "ChatMessage",
    "ConflictError",
    "FunctionCall",
    "GenerateChunk",
    "GenerateResponse",
    "GenerateStream",
    "Health",
    "Hypic",
    "HypicError",
    "InternalServerError",
    "Message",
    "Model",
    "ModelList",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "Segment",
    "SegmentDeleted",
    "SegmentInfo",
    "SegmentKind",
    "SegmentLike",
    "SegmentPage",
    "SegmentUsage",
    "ServerSentEvent",
    "Stream",
    "Timings",
    "TokenLogprob",
    "ToolCall",
    "ToolCallDelta",
    "UnprocessableEntityError",
    "Usage",
    "__version__",
    "doc",
    "memory",
    "ref",
    "skill",
    "system",
    "text",
    "turn",
    "turns",
]
