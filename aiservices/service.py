"""``ai_service``: a typed ``Protocol`` in, a working service object out."""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, overload

from .memory import ChatMemory
from .messages import ChatMessage, UserMessage

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .guardrails import InputGuardrail, OutputGuardrail
    from .models import ChatModel, ChatRequest, ChatRequestParameters
    from .observability import ConversationStats

# The memory id's parameter is `Any` in the options below: the ids are the user's own type
# (`str`, `int`, a UUID), and `Hashable` there would refuse `def provider(memory_id: str)`.

Retriever: TypeAlias = "Callable[[str, Any], Iterable[str] | Awaitable[Iterable[str]]]"
"""Finds texts for a call: ``(query, memory_id) -> list[str]`` (a generator too), or
``async def``."""

ToolProvider: TypeAlias = Callable[[Any, UserMessage], Iterable[object] | None]
"""Gives a call its extra tools: ``(memory_id, user_message) -> tools``, ``None`` for none."""

SeedMemory: TypeAlias = "Callable[[Any], Iterable[ChatMessage] | Awaitable[Iterable[ChatMessage]]]"
"""Gives a new conversation its first messages: ``memory_id -> list[ChatMessage]``, or
``async def``."""

__all__ = ["ChatMemoryAccess", "ai_service"]

T = TypeVar("T")


class ChatMemoryAccess(Protocol):
    """Inherit in an interface to reach the service's memories from typed code."""

    def get_chat_memory(self, memory_id: Hashable) -> ChatMemory:
        """The memory of ``memory_id``, made by the provider if the service has none cached."""
        ...

    def evict_chat_memory(self, memory_id: Hashable) -> None:
        """Drop the cached memory object; the stored conversation stays."""
        ...

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation: the cached memory, the stored messages and their history."""
        ...

    async def aget_chat_memory(self, memory_id: Hashable) -> ChatMemory:
        """`get_chat_memory` for async code: a provider runs in a worker thread."""
        ...

    async def aevict_chat_memory(self, memory_id: Hashable) -> None:
        """`evict_chat_memory` for async code."""
        ...

    async def aforget(self, memory_id: Hashable) -> None:
        """`forget` for async code: waits for the conversation without blocking the
        event loop, and erases a blocking store's data in a worker thread."""
        ...

    def conversation_stats(self) -> ConversationStats:
        """Conversations cached now; turns committed, messages evicted and conversations
        forgotten since the service was built."""
        ...


@overload
def ai_service(
    interface: Callable[..., T],
    /,
    *,
    model: ChatModel | str,
    chat_memory: ChatMemory | None = None,
    chat_memory_provider: Callable[[Any], ChatMemory] | None = None,
    tools: Iterable[object] = (),
    tool_provider: ToolProvider | None = None,
    tool_error_handler: Callable[..., str] | None = None,
    system_message_provider: Callable[[Any], str | None] | None = None,
    max_tool_invocations: int = 100,
    max_output_retries: int = 1,
    parameters: ChatRequestParameters | None = None,
    chat_memory_cache_size: int = 10_000,
    listeners: Sequence[object] = (),
    input_guardrails: Sequence[InputGuardrail] = (),
    output_guardrails: Sequence[OutputGuardrail] = (),
    request_transformer: Callable[[ChatRequest, Any], ChatRequest] | None = None,
    retriever: Retriever | None = None,
    seed_memory: SeedMemory | None = None,
) -> T: ...


@overload
def ai_service(
    *,
    model: ChatModel | str,
    chat_memory: ChatMemory | None = None,
    chat_memory_provider: Callable[[Any], ChatMemory] | None = None,
    tools: Iterable[object] = (),
    tool_provider: ToolProvider | None = None,
    tool_error_handler: Callable[..., str] | None = None,
    system_message_provider: Callable[[Any], str | None] | None = None,
    max_tool_invocations: int = 100,
    max_output_retries: int = 1,
    parameters: ChatRequestParameters | None = None,
    chat_memory_cache_size: int = 10_000,
    listeners: Sequence[object] = (),
    input_guardrails: Sequence[InputGuardrail] = (),
    output_guardrails: Sequence[OutputGuardrail] = (),
    request_transformer: Callable[[ChatRequest, Any], ChatRequest] | None = None,
    retriever: Retriever | None = None,
    seed_memory: SeedMemory | None = None,
) -> Callable[[Callable[..., T]], T]: ...


def ai_service(
    interface: Callable[..., T] | None = None,
    /,
    *,
    model: ChatModel | str,
    chat_memory: ChatMemory | None = None,
    chat_memory_provider: Callable[[Any], ChatMemory] | None = None,
    tools: Iterable[object] = (),
    tool_provider: ToolProvider | None = None,
    tool_error_handler: Callable[..., str] | None = None,
    system_message_provider: Callable[[Any], str | None] | None = None,
    max_tool_invocations: int = 100,
    max_output_retries: int = 1,
    parameters: ChatRequestParameters | None = None,
    chat_memory_cache_size: int = 10_000,
    listeners: Sequence[object] = (),
    input_guardrails: Sequence[InputGuardrail] = (),
    output_guardrails: Sequence[OutputGuardrail] = (),
    request_transformer: Callable[[ChatRequest, Any], ChatRequest] | None = None,
    retriever: Retriever | None = None,
    seed_memory: SeedMemory | None = None,
) -> T | Callable[[Callable[..., T]], T]:
    """Build an object implementing every method of ``interface`` (a ``typing.Protocol``).

    The interface is analysed now: every mistake in it is one ``InterfaceError`` listing
    each problem. Without ``interface`` this returns a class decorator, and the decorated
    name becomes the service object.

    ``model`` is a ``ChatModel`` or ``"openai:MODEL"`` / ``"anthropic:MODEL"`` (the SDK is
    imported at the first call). ``chat_memory_provider(memory_id)`` gives each conversation
    its memory; the service caches up to ``chat_memory_cache_size`` of them, least recently
    used evicted first. ``tools`` are ``@tool`` functions or objects with ``@tool`` methods;
    ``tool_provider(memory_id, user_message)`` adds tools per call. ``tool_error_handler(error,
    request)`` returns the text the model sees for a failed tool call, or raises to end the
    call. ``parameters`` are sent with every request (temperature, max tokens...).
    ``listeners`` see each call, request, response, tool run and error (see
    ``aiservices.observability``). ``input_guardrails`` and ``output_guardrails`` check
    each call's user message and answer (see ``aiservices.guardrails``);
    ``request_transformer(request, memory_id)`` may change every model request of a call,
    last, without the memory seeing it; ``retriever(query, memory_id)`` returns texts that go
    with the user message to the model (not to the memory) and into ``Result.sources``.
    ``seed_memory(memory_id)`` gives a new conversation its first messages (few-shot
    examples, say), recorded with its first turn.
    """
    options: dict[str, Any] = {
        "model": model,
        "chat_memory": chat_memory,
        "chat_memory_provider": chat_memory_provider,
        "tools": tools,
        "tool_provider": tool_provider,
        "tool_error_handler": tool_error_handler,
        "system_message_provider": system_message_provider,
        "max_tool_invocations": max_tool_invocations,
        "max_output_retries": max_output_retries,
        "parameters": parameters,
        "chat_memory_cache_size": chat_memory_cache_size,
        "listeners": listeners,
        "input_guardrails": input_guardrails,
        "output_guardrails": output_guardrails,
        "request_transformer": request_transformer,
        "retriever": retriever,
        "seed_memory": seed_memory,
    }
    # The builder, and the runner it wires in, load here rather than at `import aiservices`.
    from ._build import build

    # Annotations may name classes local to the caller's function: resolve them there too.
    options["localns"] = dict(sys._getframe(1).f_locals)
    if interface is None:

        def decorate(cls: Callable[..., T]) -> T:
            options["localns"].update(sys._getframe(1).f_locals)
            return build(cls, **options)

        return decorate
    return build(interface, **options)
