"""aiservices: turn a typed ``Protocol`` into a working LLM agent.

Memories, stores, streams, tools, the model types and token counting are imported on first
use, so ``import aiservices`` stays light and needs no extra installed: a store backed by a
database driver (SQLite, Redis, PostgreSQL) needs its driver only once used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

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
    from ._text_streams import AsyncEventStream, AsyncTextStream, EventStream, TextStream
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
    "EventStream": "._text_streams",
    "AsyncEventStream": "._text_streams",
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


_lazy_getattr, __dir__ = lazy_exports(__name__, _LAZY, globals())

# Stores whose driver is an extra: name -> (the extra, the modules it installs).
_DRIVER_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "RedisChatMemoryStore": ("redis", ("redis",)),
    "PostgresChatMemoryStore": ("postgres", ("psycopg", "psycopg_pool")),
}


def __getattr__(name: str) -> Any:
    try:
        return _lazy_getattr(name)
    except ModuleNotFoundError as exc:
        needs = _DRIVER_EXTRAS.get(name)
        missing = (exc.name or "").partition(".")[0]
        if needs is None or missing not in needs[1]:
            raise
        # `from aiservices import *` must work without every extra installed: the name
        # stays importable, and using it says which extra to install.
        return _needs_extra(name, needs[0], missing)


def _needs_extra(name: str, extra: str, missing: str) -> type:
    """A stand-in for a store whose driver is not installed: making one says what to do."""
    message = (
        f"{name} needs the {missing!r} package, which is not installed: "
        f'pip install "aiservices[{extra}]"'
    )

    def __new__(cls: type, *args: object, **kwargs: object) -> NoReturn:
        raise ModuleNotFoundError(message, name=missing)

    return type(name, (), {"__new__": __new__, "__doc__": message, "__module__": __name__})


__all__ = [
    "AiMessage",
    "AiServiceError",
    "AsyncEventStream",
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
    "EventStream",
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
