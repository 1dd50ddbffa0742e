"""The model seam: the ``ChatModel`` protocol and the request / response types it speaks.

Provider adapters live in their own modules (``aiservices.models.openai``,
``aiservices.models.anthropic``) and import their SDK there, so importing this package
imports no provider.
"""

from ._base import (
    AsyncChatModel,
    AsyncStreamingChatModel,
    ChatModel,
    ChatRequest,
    ChatRequestParameters,
    ChatResponse,
    ResponseFormat,
    StreamingChatModel,
    TokenUsage,
    ToolSpecification,
)

__all__ = [
    "AsyncChatModel",
    "AsyncStreamingChatModel",
    "ChatModel",
    "ChatRequest",
    "ChatRequestParameters",
    "ChatResponse",
    "ResponseFormat",
    "StreamingChatModel",
    "TokenUsage",
    "ToolSpecification",
]
