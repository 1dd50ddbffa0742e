"""aiservices: turn a typed ``Protocol`` into a working LLM agent.

Memories, stores, streams, tools, the model types and token counting are imported on first
use, so ``import aiservices`` stays light and needs no extra installed: a store backed by a
database driver (SQLite, Redis, PostgreSQL) needs its driver only once used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .errors import (
    AiServiceError,
    GuardrailError,
    IncompleteResponseError,
    InterfaceError,
    OutputParseError,
    Reprompt,
    ToolLimitError,
)
from .guardrails import guardrails
from .markers import Context, MemoryId, UserName, V
from .memory import ChatMemory, ChatMemoryProvider
from .messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
    messages_from_json,
    messages_to_json,
)
from .prompts import system_message, user_message
from .scopes import MemoryScope, current_memory_scope, memory_scope
from .service import ChatMemoryAccess, ai_service
from .stores import ChatMemoryStore

if TYPE_CHECKING:
    from ._events import StreamEvent, TextDelta, ToolCallFinished, ToolCallStarted, TurnCompleted
    from ._result import Result
    from ._text_streams import AsyncTextStream, TextStream
    from .memory import (
        MessageWindowChatMemory,
        SummarizingChatMemory,
        TokenCountEstimator,
        TokenWindowChatMemory,
    )
    from .models import (
        ChatModel,
        ChatRequest,
        ChatRequestParameters,
        ChatResponse,
        ResponseFormat,
        TokenUsage,
        ToolSpecification,
    )
    from .stores import InMemoryChatMemoryStore
    from .stores.postgres import PostgresChatMemoryStore
    from .stores.redis import RedisChatMemoryStore
    from .stores.sqlite import SqliteChatMemoryStore
    from .tools import Tool, ToolExecution, tool

__version__ = "0.1.0"

# Imported at first use, to keep `import aiservices` light: the memories (a service without
# memory needs none), the stores (the database-backed ones' drivers are optional; the
# in-memory one is made by the first memory without a store), streams, token counting, and
# what building a service loads anyway (tools, the model types, Result).
_LAZY = {
    "MessageWindowChatMemory": ".memory",
    "InMemoryChatMemoryStore": ".stores",
    "SqliteChatMemoryStore": ".stores",
    "RedisChatMemoryStore": ".stores",
    "PostgresChatMemoryStore": ".stores",
    "TokenCountEstimator": ".memory",
    "TokenWindowChatMemory": ".memory",
    "SummarizingChatMemory": ".memory",
    "TextStream": "._text_streams",
    "StreamEvent": "._events",
    "TextDelta": "._events",
    "ToolCallStarted": "._events",
    "ToolCallFinished": "._events",
    "TurnCompleted": "._events",
    "AsyncTextStream": "._text_streams",
    "tool": ".tools",
    "Tool": ".tools",
    "ToolExecution": ".tools",
    "Result": "._result",
    "ChatModel": ".models",
    "ChatRequest": ".models",
    "ChatRequestParameters": ".models",
    "ChatResponse": ".models",
    "ResponseFormat": ".models",
    "TokenUsage": ".models",
    "ToolSpecification": ".models",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "AiMessage",
    "AiServiceError",
    "AsyncTextStream",
    "ChatMemory",
    "ChatMemoryAccess",
    "ChatMemoryProvider",
    "ChatMemoryStore",
    "ChatMessage",
    "ChatModel",
    "ChatRequest",
    "ChatRequestParameters",
    "ChatResponse",
    "Context",
    "GuardrailError",
    "IncompleteResponseError",
    "InMemoryChatMemoryStore",
    "InterfaceError",
    "MemoryId",
    "MemoryScope",
    "MessageWindowChatMemory",
    "OutputParseError",
    "PostgresChatMemoryStore",
    "RedisChatMemoryStore",
    "Reprompt",
    "ResponseFormat",
    "Result",
    "SqliteChatMemoryStore",
    "StreamEvent",
    "SummarizingChatMemory",
    "SystemMessage",
    "TokenCountEstimator",
    "TextDelta",
    "TextStream",
    "TokenUsage",
    "Tool",
    "TokenWindowChatMemory",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolExecution",
    "ToolExecutionRequest",
    "ToolExecutionResultMessage",
    "ToolLimitError",
    "ToolSpecification",
    "TurnCompleted",
    "UserMessage",
    "UserName",
    "V",
    "ai_service",
    "current_memory_scope",
    "guardrails",
    "memory_scope",
    "messages_from_json",
    "messages_to_json",
    "system_message",
    "tool",
    "user_message",
]
