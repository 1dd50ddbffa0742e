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
    "AsyncEventStream",
    "EventStream",
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
    # guardrails and typed event streams
    "GuardrailError",
    "Reprompt",
    "guardrails",
    "StreamEvent",
    "TextDelta",
    "ToolCallStarted",
    "ToolCallFinished",
    "TurnCompleted",
    # scopes
    "MemoryScope",
    "memory_scope",
    "current_memory_scope",
    # tools with context, tools from a schema
    "Context",
    "Tool",
    # provider fixes
    "IncompleteResponseError",
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


def _fresh_interpreter(code: str) -> str:
    """What ``code`` prints in a new Python process, where nothing is imported yet."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def test_import_loads_no_provider_sdk_or_store_driver() -> None:
    code = (
        "import sys, aiservices, aiservices.testing\n"
        "heavy = {'openai', 'anthropic', 'httpx', 'redis', 'psycopg', 'psycopg_pool', "
        "'sqlite3', 'tiktoken', 'opentelemetry'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = _fresh_interpreter(code).strip()
    assert out == "[]"


# Needed only once a service is built, a memory is made or a feature is used; importing them
# with the package would cost every program that imports aiservices.
DEFERRED = (
    "aiservices._build",
    "aiservices._hooks",
    "aiservices._locks",
    "aiservices._output",
    "aiservices._plan",
    "aiservices._result",
    "aiservices._runner",
    "aiservices._templates",
    "aiservices._toolbox",
    "aiservices._tool_schema",
    "aiservices._streams",
    "aiservices.memory._history",
    "aiservices.memory._window",
    "aiservices.memory._window_memory",
    "aiservices.memory._store_ops",
    "aiservices.memory.summarizing",
    "aiservices.memory.token_window",
    "aiservices.memory.tokens",
    "aiservices.memory.window",
    "aiservices.models._base",
    "aiservices.models._registry",
    "aiservices.stores._common",
    "aiservices.stores.in_memory",
    "aiservices.stores.postgres",
    "aiservices.stores.redis",
    "aiservices.stores.sqlite",
    "aiservices.tools",
    "logging",
)


def test_import_defers_modules_used_only_later() -> None:
    code = f"import sys, aiservices\nprint(sorted(set({DEFERRED!r}) & set(sys.modules)))\n"
    out = _fresh_interpreter(code).strip()
    assert out == "[]"


def test_deferred_names_are_the_defining_modules_objects() -> None:
    import aiservices.memory._window_memory
    import aiservices.memory.token_window
    import aiservices.memory.tokens
    import aiservices.memory.window
    import aiservices.stores._common
    import aiservices.stores.in_memory

    memory, stores = aiservices.memory, aiservices.stores
    assert aiservices.InMemoryChatMemoryStore is stores.in_memory.InMemoryChatMemoryStore
    assert aiservices.MessageWindowChatMemory is memory.window.MessageWindowChatMemory
    assert memory.WindowChatMemoryProvider is memory._window_memory.WindowChatMemoryProvider
    assert aiservices.TokenWindowChatMemory is memory.token_window.TokenWindowChatMemory
    assert aiservices.TokenCountEstimator is memory.tokens.TokenCountEstimator
    for name in ("EncodingUnavailableError", "OpenAiTokenCountEstimator", "TokenCountEstimator"):
        assert getattr(memory, name) is getattr(memory.tokens, name), name
    for name in ("ChatHistoryStore", "CorruptMessageError", "HistoryEntry", "StoreSchemaError"):
        assert getattr(stores, name) is getattr(stores._common, name), name
    assert stores.InMemoryChatMemoryStore is stores.in_memory.InMemoryChatMemoryStore
    import aiservices.tools

    assert aiservices.tool is aiservices.tools.tool
    assert aiservices.ToolExecution is aiservices.tools.ToolExecution
    import aiservices._result
    import aiservices.models

    assert aiservices.Result is aiservices._result.Result
    for name in ("ChatModel", "ChatRequest", "ChatResponse", "TokenUsage", "ToolSpecification"):
        assert getattr(aiservices, name) is getattr(aiservices.models, name), name


def test_dir_lists_names_not_yet_imported() -> None:
    code = (
        "import aiservices, aiservices.memory, aiservices.stores\n"
        "print('MessageWindowChatMemory' in dir(aiservices),"
        " 'TokenWindowChatMemory' in dir(aiservices.memory),"
        " 'SqliteChatMemoryStore' in dir(aiservices.stores),"
        " 'aiservices.stores.sqlite' in __import__('sys').modules)\n"
    )
    out = _fresh_interpreter(code).split()
    assert out == ["True", "True", "True", "False"]
