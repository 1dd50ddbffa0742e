"""aiservices: turn a typed ``Protocol`` into a working LLM agent."""

from __future__ import annotations

from .errors import AiServiceError, InterfaceError, OutputParseError, ToolLimitError
from .markers import MemoryId, UserName, V
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

__version__ = "0.1.0"

__all__ = [
    "AiMessage",
    "AiServiceError",
    "ChatMessage",
    "InterfaceError",
    "MemoryId",
    "OutputParseError",
    "SystemMessage",
    "ToolExecutionRequest",
    "ToolExecutionResultMessage",
    "ToolLimitError",
    "UserMessage",
    "UserName",
    "V",
    "messages_from_json",
    "messages_to_json",
]
