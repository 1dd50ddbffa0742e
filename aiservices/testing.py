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
from dataclasses import dataclass
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

__all__ = ["Interrupted", "Reply", "ScriptedChatModel", "tool_call", "tool_calls"]


@dataclass(frozen=True)
class Interrupted:
    """A reply that streams ``text`` and then raises ``error``, as a connection dropped
    midway does; a call that does not stream raises ``error`` at once."""

    text: str
    error: BaseException | type[BaseException]


_Answer: TypeAlias = (
    str | AiMessage | ChatResponse | Interrupted | BaseException | type[BaseException]
)
Reply: TypeAlias = _Answer | Callable[[ChatRequest], _Answer | None]
"""A scripted answer: text, a message, a whole response, an error (or its class) to raise,
a stream broken midway, or a function of the request that returns one of those."""

_KINDS = (
    "a str, an AiMessage, a ChatResponse, an Interrupted, an exception (or its class) or a "
    "callable (request) -> reply"
)

_ids = iter(range(1, 1 << 62))
_ids_lock = threading.Lock()


def _call_id() -> str:
    with _ids_lock:
        return f"call_{next(_ids)}"


def _check_replies(replies: tuple[object, ...], where: str) -> None:
    for reply in replies:
        if isinstance(reply, list | tuple):
            raise TypeError(
                f"{where}: a reply is {_KINDS}, not a {type(reply).__name__}; pass the "
                "replies one by one: ScriptedChatModel(*replies)"
            )
        if not (
            isinstance(reply, str | AiMessage | ChatResponse | Interrupted | BaseException)
            or callable(reply)
        ):
            raise TypeError(f"{where}: a reply is {_KINDS}, not {reply!r:.60}")
        if isinstance(reply, type) and not issubclass(reply, BaseException):
            raise TypeError(
                f"{where}: the class {reply.__name__} is not a reply; a reply is {_KINDS}"
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

    A scripted tool request must name a tool the request offers, with the arguments its
    schema requires and no others it refuses: else the call fails with an
    ``AssertionError``, since the service would only tell the model its mistake and the test
    could pass with no tool run. ``check_tools=False`` lets such requests through, to test
    how a service answers a model that names a tool wrongly.
    """

    def __init__(
        self,
        *replies: Reply,
        default: Reply | None = None,
        delay: float = 0.0,
        usage: TokenUsage | None = None,
        chunk_size: int = 4,
        model_name: str = "scripted",
        check_tools: bool = True,
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
        self.check_tools = check_tools
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
        left = list(self._replies)
        if left:
            shown = ", ".join(f"{reply!r:.80}" for reply in left[:5])
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise AssertionError(
                f"{len(left)} scripted {'reply was' if len(left) == 1 else 'replies were'} "
                f"not used: {shown}{more}"
            )

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
        try:
            request = self.requests[index]
        except IndexError:
            raise AssertionError(
                f"the model received {len(self.requests)} request(s): there is no request {index}"
            ) from None
        return [(_kind(m), m.text) for m in request.messages]

    # -- the ChatModel protocol ---------------------------------------------------------

    def _next(self, request: ChatRequest) -> ChatResponse | Interrupted:
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

    def _respond(self, reply: Reply | None, request: ChatRequest) -> ChatResponse | Interrupted:
        if callable(reply) and not isinstance(reply, type):
            function = reply
            reply = function(request)
            if callable(reply) and not isinstance(reply, type):
                raise TypeError(
                    f"the reply function {function!r:.60} returned {reply!r:.60}, a callable: "
                    f"a reply function returns {_KINDS.rpartition(' or ')[0]} or None"
                )
            _check_replies((reply,) if reply is not None else (), "a reply function's answer")
        if isinstance(reply, Interrupted):
            return reply
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
        if message.tool_execution_requests and self.check_tools:
            _check_tool_requests(message, request)
        finish = "tool_calls" if message.tool_execution_requests else "stop"
        return ChatResponse(message, self.usage, finish)

    def chat(self, request: ChatRequest) -> ChatResponse:
        return _answer(self._waited(request))

    async def achat(self, request: ChatRequest) -> ChatResponse:
        return _answer(await self._awaited(request))

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        yield from self._pieces(self._waited(request))

    async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
        for piece in self._pieces(await self._awaited(request)):
            yield piece

    def _waited(self, request: ChatRequest) -> ChatResponse | Interrupted:
        if self.delay:
            time.sleep(self.delay)
        return self._next(request)

    async def _awaited(self, request: ChatRequest) -> ChatResponse | Interrupted:
        if self.delay:
            await asyncio.sleep(self.delay)
        return self._next(request)

    def _pieces(self, reply: ChatResponse | Interrupted) -> Iterator[str | ChatResponse]:
        """A stream of ``reply``: its text in chunks, then the response (or the error)."""
        if isinstance(reply, Interrupted):
            yield from self._chunks(reply.text)
            raise reply.error
        yield from self._chunks(reply.ai_message.text)
        yield reply

    def _chunks(self, text: str | None) -> Iterable[str]:
        if not text:
            return ()
        size = max(1, self.chunk_size)
        return [text[i : i + size] for i in range(0, len(text), size)]

    def __repr__(self) -> str:
        return f"ScriptedChatModel(remaining={self.remaining}, requests={len(self.requests)})"


def _answer(reply: ChatResponse | Interrupted) -> ChatResponse:
    if isinstance(reply, Interrupted):  # nothing streamed: the error comes at once
        raise reply.error
    return reply


def _check_tool_requests(message: AiMessage, request: ChatRequest) -> None:
    """Fail when a scripted tool request does not fit the tools the request offers."""
    offered = {spec.name: spec for spec in request.tools}
    for call in message.tool_execution_requests:
        spec = offered.get(call.name)
        if spec is None:
            names = ", ".join(repr(name) for name in offered)
            raise AssertionError(
                f"the script asks for the tool {call.name!r}, but the request offers "
                + (f"only {names}" if names else "no tools (pass tools=[...] to ai_service)")
                + "; fix the script or the service's tools, or make the model with "
                "check_tools=False to test a request for a tool that is not there"
            )
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            continue  # scripted on purpose: the service answers malformed JSON itself
        if not isinstance(arguments, dict):
            continue
        schema = spec.parameters
        properties = schema.get("properties") or {}
        missing = [name for name in schema.get("required") or () if name not in arguments]
        unknown = (
            [name for name in arguments if name not in properties]
            if schema.get("additionalProperties") is False
            else []
        )
        if missing or unknown:
            problems = []
            if missing:
                problems.append("leaves out " + ", ".join(map(repr, missing)))
            if unknown:
                problems.append("passes " + ", ".join(map(repr, unknown)) + ", which it has not")
            raise AssertionError(
                f"the script's call of the tool {call.name!r} {' and '.join(problems)} "
                f"(its parameters: {', '.join(map(repr, properties)) or 'none'}); fix the "
                "script, or make the model with check_tools=False to test a call with wrong "
                "arguments"
            )


def _kind(message: ChatMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, UserMessage):
        return "user"
    if isinstance(message, ToolExecutionResultMessage):
        return "tool"
    return "ai"
