"""Test doubles for services: a scripted model that answers from a queue and records requests.

```python
model = ScriptedChatModel("Hello Alice!", tool_call("lookup", order="42"), "It shipped.")
bot = ai_service(Assistant, model=model)
assert bot.chat("Hi") == "Hello Alice!"
assert model.last_user_text == "Hi"
```
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, TypeAlias

from .messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from .models import ChatRequest, ChatResponse, TokenUsage

__all__ = ["Reply", "ScriptedChatModel", "tool_call", "tool_calls"]

Reply: TypeAlias = (
    "str | AiMessage | ChatResponse | BaseException | Callable[[ChatRequest], Reply | None]"
)
"""A scripted answer: text, a message, a whole response, an error (or its class) to raise,
or a function of the request that returns one of those."""

_ids = iter(range(1, 1 << 62))
_ids_lock = threading.Lock()


def _call_id() -> str:
    with _ids_lock:
        return f"call_{next(_ids)}"


def _check_replies(replies: tuple[object, ...], where: str) -> None:
    for reply in replies:
        if isinstance(reply, list | tuple):
            raise TypeError(
                f"{where}: a reply is a str, an AiMessage, a ChatResponse, an exception or a "
                f"callable, not a {type(reply).__name__}; pass the replies one by one: "
                "ScriptedChatModel(*replies)"
            )
        if not (
            isinstance(reply, str | AiMessage | ChatResponse | BaseException) or callable(reply)
        ):
            raise TypeError(
                f"{where}: a reply is a str, an AiMessage, a ChatResponse, an exception or a "
                f"callable (request) -> reply, not {reply!r:.60}"
            )
        if isinstance(reply, type) and not issubclass(reply, BaseException):
            raise TypeError(
                f"{where}: the class {reply.__name__} is not a reply; a reply is a str, an "
                "AiMessage, a ChatResponse, an exception (or its class) or a callable "
                "(request) -> reply"
            )


def tool_call(name: str, /, **arguments: Any) -> AiMessage:
    """An answer asking for one tool, with the keyword arguments as its JSON arguments."""
    return tool_calls((name, arguments))


def tool_calls(*calls: tuple[str, dict[str, Any]]) -> AiMessage:
    """An answer asking for several tools at once: ``tool_calls(("a", {...}), ("b", {...}))``."""
    return AiMessage(
        tool_execution_requests=[
            ToolExecutionRequest(_call_id(), name, json.dumps(args)) for name, args in calls
        ]
    )


class ScriptedChatModel:
    """A ``ChatModel`` that answers with scripted replies, in order, and records every request.

    ``default`` answers once the queue is empty (without it, an empty queue is an
    ``AssertionError`` naming the request). ``delay`` seconds are slept (or awaited, on the
    async path) before each answer. ``usage`` is reported with every answer that has none.
    ``chunk_size`` splits streamed text into pieces of that many characters.
    """

    def __init__(
        self,
        *replies: Reply,
        default: Reply | None = None,
        delay: float = 0.0,
        usage: TokenUsage | None = None,
        chunk_size: int = 4,
        model_name: str = "scripted",
    ) -> None:
        _check_replies(replies, "ScriptedChatModel(...)")
        if default is not None:
            _check_replies((default,), "default=")
        self._replies: deque[Reply] = deque(replies)
        self._lock = threading.Lock()
        self.default = default
        self.delay = delay
        self.usage = usage
        self.chunk_size = chunk_size
        self.model_name = model_name
        self.requests: list[ChatRequest] = []

    # -- scripting ------------------------------------------------------------------

    def add_replies(self, *replies: Reply) -> None:
        """Queue more replies after the ones left."""
        _check_replies(replies, "add_replies(...)")
        with self._lock:
            self._replies.extend(replies)

    @property
    def remaining(self) -> int:
        """How many scripted replies are still queued."""
        return len(self._replies)

    def assert_all_used(self) -> None:
        """Fail if some scripted replies were never asked for."""
        if self._replies:
            raise AssertionError(f"{len(self._replies)} scripted replies were not used")

    # -- what was sent ----------------------------------------------------------------

    @property
    def last_request(self) -> ChatRequest:
        """The most recent request."""
        if not self.requests:
            raise AssertionError("the model received no request")
        return self.requests[-1]

    @property
    def last_messages(self) -> list[ChatMessage]:
        """The messages of the most recent request."""
        return list(self.last_request.messages)

    @property
    def last_user_text(self) -> str | None:
        """The text of the last user message in the most recent request."""
        for message in reversed(self.last_request.messages):
            if isinstance(message, UserMessage):
                return message.text
        return None

    @property
    def last_system_text(self) -> str | None:
        """The system message's text in the most recent request."""
        for message in self.last_request.messages:
            if isinstance(message, SystemMessage):
                return message.text
        return None

    def sent_texts(self, index: int = -1) -> list[tuple[str, str | None]]:
        """``(type, text)`` of each message in request ``index``, for compact assertions."""
        return [(_kind(m), m.text) for m in self.requests[index].messages]

    # -- the ChatModel protocol ---------------------------------------------------------

    def _next(self, request: ChatRequest) -> ChatResponse:
        with self._lock:
            self.requests.append(request)
            if self._replies:
                reply: Reply | None = self._replies.popleft()
            else:
                reply = self.default
        if reply is None:
            raise AssertionError(
                f"ScriptedChatModel has no reply left for a request ending with "
                f"{request.messages[-1]!r}; script more replies or set default="
            )
        return self._respond(reply, request)

    def _respond(self, reply: Reply | None, request: ChatRequest) -> ChatResponse:
        while callable(reply) and not isinstance(reply, type):
            reply = reply(request)
        if isinstance(reply, BaseException) or (
            isinstance(reply, type) and issubclass(reply, BaseException)
        ):
            raise reply  # an exception, or its class (raised as `raise TimeoutError` does)
        if isinstance(reply, ChatResponse):
            if reply.token_usage is None and self.usage is not None:
                return ChatResponse(reply.ai_message, self.usage, reply.finish_reason)
            return reply
        if isinstance(reply, str) or reply is None:  # (None: a callable's answer with no text)
            message = AiMessage(reply)
        elif isinstance(reply, AiMessage):
            message = reply
        else:
            raise TypeError(f"not a scripted reply: {reply!r}")
        finish = "tool_calls" if message.tool_execution_requests else "stop"
        return ChatResponse(message, self.usage, finish)

    def chat(self, request: ChatRequest) -> ChatResponse:
        if self.delay:
            time.sleep(self.delay)
        return self._next(request)

    async def achat(self, request: ChatRequest) -> ChatResponse:
        if self.delay:
            await asyncio.sleep(self.delay)
        return self._next(request)

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        response = self.chat(request)
        yield from self._chunks(response.ai_message.text)
        yield response

    async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
        response = await self.achat(request)
        for chunk in self._chunks(response.ai_message.text):
            yield chunk
        yield response

    def _chunks(self, text: str | None) -> Iterable[str]:
        if not text:
            return ()
        size = max(1, self.chunk_size)
        return [text[i : i + size] for i in range(0, len(text), size)]

    def __repr__(self) -> str:
        return f"ScriptedChatModel(remaining={self.remaining}, requests={len(self.requests)})"


def _kind(message: ChatMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, UserMessage):
        return "user"
    if isinstance(message, ToolExecutionResultMessage):
        return "tool"
    return "ai"
