"""Typed event streams: text deltas, tool calls started and finished, and last the
completed turn, committed before it is yielded; nothing committed when closed early."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Protocol

import pytest
from _recorded import StoreUnderTest, store_under_test

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    StreamEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolExecutionRequest,
    TurnCompleted,
    ai_service,
    tool,
)
from aiservices.models import ChatRequest, ChatResponse, TokenUsage

__all__ = ["store_under_test"]


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class StreamingModel:
    """Streams its answers word by word: first a tool request, then the weather."""

    def __init__(self) -> None:
        self.rounds = 0

    def _answer(self) -> ChatResponse:
        self.rounds += 1
        if self.rounds == 1:
            return ChatResponse(
                AiMessage(
                    "Let me check.",
                    [ToolExecutionRequest("w1", "weather", '{"city": "Oslo"}')],
                ),
                TokenUsage(5, 2),
            )
        return ChatResponse(AiMessage("It is sunny in Oslo."), TokenUsage(9, 6), "stop")

    def chat(self, request: ChatRequest) -> ChatResponse:
        return self._answer()

    def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
        response = self._answer()
        for word in (response.ai_message.text or "").split(" "):
            yield word + " "
        yield response

    async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
        for piece in self.stream(request):
            yield piece


class Bot(ChatMemoryAccess, Protocol):
    def events(self, user: Annotated[str, MemoryId], text: str) -> Iterator[StreamEvent]: ...

    def aevents(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[StreamEvent]: ...

    def text(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...


def _bot(found: StoreUnderTest) -> Bot:
    return ai_service(
        Bot,
        model=StreamingModel(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20, store=found.store),
        tools=[weather],
    )


def _shape(events: list[StreamEvent]) -> list[Any]:
    shape: list[Any] = []
    for event in events:
        if isinstance(event, TextDelta):
            shape.append(event.text)
        elif isinstance(event, ToolCallStarted):
            shape.append(("started", event.request.name))
        elif isinstance(event, ToolCallFinished):
            shape.append(("finished", event.execution.result))
        else:
            shape.append(("completed", event.result.content))
    return shape


EXPECTED = [
    "Let ",
    "me ",
    "check. ",
    ("started", "weather"),
    ("finished", "sunny in Oslo"),
    "It ",
    "is ",
    "sunny ",
    "in ",
    "Oslo. ",
    ("completed", "It is sunny in Oslo."),
]


def test_a_sync_event_stream_yields_text_tools_and_the_completed_turn(
    store_under_test: StoreUnderTest,
) -> None:
    bot = _bot(store_under_test)
    events: list[StreamEvent] = []
    for event in bot.events("u", "Weather in Oslo?"):
        events.append(event)
        if isinstance(event, TurnCompleted):
            # Committed before the last event is yielded.
            stored = store_under_test.store.get_messages("u")
            assert [type(m).__name__ for m in stored] == [
                "UserMessage",
                "AiMessage",
                "ToolExecutionResultMessage",
                "AiMessage",
            ]
    assert _shape(events) == EXPECTED
    completed = events[-1]
    assert isinstance(completed, TurnCompleted)
    assert completed.result.token_usage == TokenUsage(14, 8)
    assert completed.result.finish_reason == "stop"
    assert [e.request.name for e in completed.result.tool_executions] == ["weather"]


def test_an_async_event_stream_yields_the_same(store_under_test: StoreUnderTest) -> None:
    bot = _bot(store_under_test)

    async def collect() -> list[StreamEvent]:
        return [event async for event in bot.aevents("u", "Weather in Oslo?")]

    assert _shape(asyncio.run(collect())) == EXPECTED
    assert len(store_under_test.store.get_messages("u")) == 4


@pytest.mark.parametrize("stop_after", [1, 4, 10])
def test_a_stream_closed_before_the_end_commits_nothing(
    store_under_test: StoreUnderTest, stop_after: int
) -> None:
    bot = _bot(store_under_test)
    bot.text("u", "first")  # a stream not iterated does nothing at all
    before = store_under_test.snapshot()
    stream = bot.events("u", "Weather in Oslo?")
    for i, _ in enumerate(stream):
        if i + 1 == stop_after:
            break
    stream.close()  # type: ignore[attr-defined]
    assert store_under_test.snapshot() == before
    # The conversation's lock was released: the next call runs.
    assert [type(e).__name__ for e in bot.events("u", "again")][-1] == "TurnCompleted"


def test_an_async_stream_closed_before_the_end_commits_nothing(
    store_under_test: StoreUnderTest,
) -> None:
    bot = _bot(store_under_test)
    before = store_under_test.snapshot()

    async def stop_early() -> None:
        stream = bot.aevents("u", "Weather in Oslo?")
        async for event in stream:
            if isinstance(event, ToolCallFinished):
                break
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(stop_early())
    assert store_under_test.snapshot() == before


def test_text_streams_still_yield_text_only(store_under_test: StoreUnderTest) -> None:
    bot = _bot(store_under_test)
    stream = bot.text("u", "Weather in Oslo?")
    assert "".join(stream) == "Let me check. It is sunny in Oslo. "
    assert stream.result is not None  # type: ignore[attr-defined]
    assert stream.result.content == "It is sunny in Oslo."  # type: ignore[attr-defined]


def test_a_direct_return_tool_answers_as_a_text_delta() -> None:
    @tool(return_direct=True)
    def lookup(order: str) -> str:
        """An order's status."""
        return f"order {order}: shipped"

    class Model:
        def chat(self, request: ChatRequest) -> ChatResponse:
            return ChatResponse(
                AiMessage(
                    tool_execution_requests=[ToolExecutionRequest("c", "lookup", '{"order": "7"}')]
                )
            )

    class Orders(Protocol):
        def ask(self, text: str) -> Iterator[StreamEvent]: ...

    bot = ai_service(Orders, model=Model(), tools=[lookup])
    shape = _shape(list(bot.ask("order 7?")))
    assert shape == [
        ("started", "lookup"),
        ("finished", "order 7: shipped"),
        "order 7: shipped",
        ("completed", "order 7: shipped"),
    ]


def test_event_streams_are_declared_as_iterators_of_stream_events() -> None:
    class Wrong(Protocol):
        def events(self, text: str) -> Iterator[int]: ...

    with pytest.raises(InterfaceError, match="yields str or StreamEvent"):
        ai_service(Wrong, model=StreamingModel())


def test_a_stream_abandoned_midway_releases_its_conversation_at_once() -> None:
    import threading

    bot = ai_service(
        Bot,
        model=StreamingModel(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[weather],
    )
    for _ in bot.text("u", "Weather in Oslo?"):
        break  # the stream is dropped here, unfinished
    done = threading.Event()

    def next_call() -> None:
        list(bot.events("u", "again"))
        done.set()

    threading.Thread(target=next_call, daemon=True).start()
    assert done.wait(5), "the conversation stayed locked by the abandoned stream"


def test_closing_a_stream_after_its_turn_completed_is_no_failure() -> None:
    ended: list[str] = []

    class Listener:
        def on_call_end(self, info: Any, result: Any) -> None:
            ended.append("end")

        def on_error(self, info: Any, error: BaseException) -> None:
            ended.append(f"error {type(error).__name__}")

    bot = ai_service(
        Bot,
        model=StreamingModel(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[weather],
        listeners=[Listener()],
    )
    stream = bot.events("u", "Weather in Oslo?")
    for event in stream:
        if isinstance(event, TurnCompleted):
            break
    stream.close()  # type: ignore[attr-defined]
    assert ended == ["end"]
