"""The public surface: what users import is pinned here, so changes to it are deliberate."""

from __future__ import annotations

import subprocess
import sys

import aiservices
import aiservices.errors
import aiservices.messages

EXPECTED = {
    "AiMessage",
    "AiServiceError",
    "AsyncTextStream",
    "TextStream",
    "ChatMemory",
    "ChatMemoryAccess",
    "ChatMemoryProvider",
    "ChatMemoryStore",
    "ChatMessage",
    "ChatModel",
    "ChatRequest",
    "ChatRequestParameters",
    "ChatResponse",
    "InMemoryChatMemoryStore",
    "InterfaceError",
    "MemoryId",
    "MessageWindowChatMemory",
    "OutputParseError",
    "PostgresChatMemoryStore",
    "RedisChatMemoryStore",
    "ResponseFormat",
    "Result",
    "SqliteChatMemoryStore",
    "SummarizingChatMemory",
    "SystemMessage",
    "TokenCountEstimator",
    "TokenUsage",
    "TokenWindowChatMemory",
    "ToolExecution",
    "ToolExecutionRequest",
    "ToolExecutionResultMessage",
    "ToolLimitError",
    "ToolSpecification",
    "UserMessage",
    "UserName",
    "V",
    "ai_service",
    "messages_from_json",
    "messages_to_json",
    "system_message",
    "tool",
    "user_message",
}


def test_all_is_pinned() -> None:
    assert set(aiservices.__all__) == EXPECTED


def test_every_exported_name_resolves() -> None:
    for name in aiservices.__all__:
        assert getattr(aiservices, name) is not None, name


def test_messages_and_errors_are_importable_from_their_modules() -> None:
    for name in (
        "SystemMessage",
        "UserMessage",
        "AiMessage",
        "ToolExecutionRequest",
        "ToolExecutionResultMessage",
        "messages_to_json",
        "messages_from_json",
    ):
        assert getattr(aiservices.messages, name) is getattr(aiservices, name)
    for name in ("AiServiceError", "InterfaceError", "OutputParseError", "ToolLimitError"):
        assert getattr(aiservices.errors, name) is getattr(aiservices, name)


def test_error_tree() -> None:
    assert issubclass(aiservices.InterfaceError, aiservices.AiServiceError)
    assert issubclass(aiservices.InterfaceError, TypeError)
    assert issubclass(aiservices.OutputParseError, aiservices.AiServiceError)
    assert issubclass(aiservices.OutputParseError, ValueError)
    assert issubclass(aiservices.ToolLimitError, aiservices.AiServiceError)


def test_import_loads_no_provider_sdk_or_store_driver() -> None:
    code = (
        "import sys, aiservices, aiservices.testing\n"
        "heavy = {'openai', 'anthropic', 'httpx', 'redis', 'psycopg', 'psycopg_pool', "
        "'sqlite3', 'tiktoken', 'opentelemetry'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"
