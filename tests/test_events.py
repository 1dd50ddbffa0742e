"""Typed event streams: text deltas, tool calls started and finished, and last the
completed turn, committed before it is yielded; nothing committed when closed early."""

from __future__ import annotations

import asyncio
import json
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


def test_a_stream_closed_at_a_direct_return_tools_answer_records_nothing() -> None:
    # The answer no model streamed is handed over before the turn is recorded, as a model's
    # last delta is: a reader who stops there leaves the conversation as it was.
    @tool(return_direct=True)
    def lookup(order: str) -> str:
        """An order's status."""
        return f"order {order}: shipped"

    class Orders(ChatMemoryAccess, Protocol):
        def events(self, user: Annotated[str, MemoryId], text: str) -> Iterator[StreamEvent]: ...

        def text(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

        async def aevents(
            self, user: Annotated[str, MemoryId], text: str
        ) -> AsyncIterator[StreamEvent]: ...

    from aiservices.testing import ScriptedChatModel, tool_call

    model = ScriptedChatModel(*[tool_call("lookup", order="7")] * 4)
    bot = ai_service(
        Orders,
        model=model,
        tools=[lookup],
        chat_memory_provider=MessageWindowChatMemory.provider(20),
    )
    with bot.events("ann", "order 7?") as events:
        for event in events:
            if isinstance(event, TextDelta):
                assert event.text == "order 7: shipped"
                break
    assert events.result is None
    with bot.text("bob", "order 7?") as chunks:
        assert next(chunks) == "order 7: shipped"
    assert chunks.result is None

    async def stop_at_the_answer() -> None:
        async with await bot.aevents("cid", "order 7?") as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    break

    asyncio.run(stop_at_the_answer())
    assert [bot.get_chat_memory(user).messages() for user in ("ann", "bob", "cid")] == [[]] * 3
    # Read to its end, the same stream records the turn.
    assert [type(e).__name__ for e in bot.events("dan", "order 7?")][-2:] == [
        "TextDelta",
        "TurnCompleted",
    ]
    assert len(bot.get_chat_memory("dan").messages()) == 3


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


class Dropped(Protocol):
    def events(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[StreamEvent]: ...

    async def text(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[str]: ...

    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def test_an_async_stream_dropped_midway_lets_its_reader_call_again_at_once() -> None:
    # Left by `break`, the stream is closed by the event loop a moment later: the reader's
    # next call on its conversation waits for that instead of being refused as a call
    # from inside the turn.
    from aiservices.testing import ScriptedChatModel

    model = ScriptedChatModel(default="a long answer in pieces", chunk_size=3)
    bot = ai_service(
        Dropped, model=model, chat_memory_provider=MessageWindowChatMemory.provider(20)
    )

    async def main() -> list[str]:
        async for _ in bot.events("ada", "hi"):
            break
        first = await asyncio.wait_for(bot.chat("ada", "again"), 5)
        async for _ in await bot.text("ada", "hi"):
            break
        second = await asyncio.wait_for(bot.chat("ada", "and again"), 5)
        return [first, second]

    assert asyncio.run(main()) == ["a long answer in pieces"] * 2
    texts = [m.text for m in bot.get_chat_memory("ada").messages()]  # type: ignore[attr-defined]
    assert texts == ["again", "a long answer in pieces", "and again", "a long answer in pieces"]


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


def _free_bot() -> Bot:
    return ai_service(
        Bot,
        model=StreamingModel(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[weather],
    )


def test_the_conversation_is_free_once_turn_completed_is_out() -> None:
    # A consumer that acts on TurnCompleted inside its loop calls on the conversation while
    # the stream is still open: that call must not wait for the stream's next step.
    import threading

    bot = _free_bot()
    answers: list[str] = []

    def consume() -> None:
        for event in bot.events("u", "Weather in Oslo?"):
            if isinstance(event, TurnCompleted):
                answers.append("".join(bot.text("u", "And tomorrow?")))

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "a call made on TurnCompleted waited for the stream"
    assert answers == ["It is sunny in Oslo. "]  # the model answers its third round
    assert [m.text for m in bot.get_chat_memory("u").messages()][-2:] == [
        "And tomorrow?",
        "It is sunny in Oslo.",
    ]


async def test_the_conversation_is_free_once_turn_completed_is_out_async() -> None:
    bot = _free_bot()
    answers: list[str] = []

    async def consume() -> None:
        async for event in bot.aevents("u", "Weather in Oslo?"):
            if isinstance(event, TurnCompleted):
                async for other in bot.aevents("u", "And tomorrow?"):
                    if isinstance(other, TurnCompleted):
                        answers.append(other.result.content)

    await asyncio.wait_for(consume(), 5)
    assert answers == ["It is sunny in Oslo."]


def test_a_stream_left_holding_turn_completed_does_not_hold_the_conversation() -> None:
    bot = _free_bot()
    stream = bot.events("u", "Weather in Oslo?")
    for event in stream:
        if isinstance(event, TurnCompleted):
            break
    # `stream` is still referenced and unfinished; the turn was recorded and let go.
    memory = bot.get_chat_memory("u")
    assert not memory_lock(bot, "u").locked
    assert len(memory.messages()) == 4


def memory_lock(bot: Any, memory_id: str) -> Any:
    from aiservices._conversations import key_of

    entry = bot._state.conversations.cached(key_of(memory_id))
    assert entry is not None
    return entry.lock


def test_event_streams_close_and_work_as_context_managers() -> None:
    from aiservices import EventStream

    bot = _free_bot()
    with bot.events("u", "Weather in Oslo?") as stream:
        assert isinstance(stream, EventStream)
        first = next(stream)
    assert first == TextDelta("Let ")
    assert bot.get_chat_memory("u").messages() == []  # left early: nothing recorded
    again = bot.events("u", "Weather in Oslo?")
    next(again)
    again.close()  # type: ignore[attr-defined]
    assert bot.get_chat_memory("u").messages() == []
    assert not memory_lock(bot, "u").locked


async def test_async_event_streams_close_and_work_as_context_managers() -> None:
    from aiservices import AsyncEventStream

    bot = _free_bot()
    async with bot.aevents("u", "Weather in Oslo?") as stream:  # type: ignore[attr-defined]
        assert isinstance(stream, AsyncEventStream)
        first = await stream.__anext__()
    assert first == TextDelta("Let ")
    assert bot.get_chat_memory("u").messages() == []
    assert not memory_lock(bot, "u").locked


def test_event_streams_may_be_declared_by_their_class() -> None:
    from aiservices import AsyncEventStream, EventStream

    class Typed(Protocol):
        def events(self, text: str) -> EventStream: ...

        async def aevents(self, text: str) -> AsyncEventStream: ...

    bot = ai_service(Typed, model=StreamingModel(), tools=[weather])
    with bot.events("Weather in Oslo?") as stream:
        shape = _shape(list(stream))
    assert shape == EXPECTED
    assert stream.result is not None
    assert stream.result.content == "It is sunny in Oslo."

    bot = ai_service(Typed, model=StreamingModel(), tools=[weather])

    async def read() -> list[StreamEvent]:
        async with await bot.aevents("Weather in Oslo?") as events:
            return [event async for event in events]

    assert _shape(asyncio.run(read())) == EXPECTED


def test_generator_return_types_point_at_iterators() -> None:
    from collections.abc import AsyncGenerator, Generator

    class Gen(Protocol):
        def text(self, text: str) -> Generator[str, None, None]: ...

    class AsyncGen(Protocol):
        async def text(self, text: str) -> AsyncGenerator[str, None]: ...

    for interface in (Gen, AsyncGen):
        with pytest.raises(InterfaceError, match=r"an iterator, not a generator.*Iterator\[str\]"):
            ai_service(interface, model=StreamingModel())


async def test_closing_an_async_stream_closes_the_models_stream_at_once() -> None:
    # A provider's stream holds its HTTP response open until it is closed.
    closed: list[str] = []

    class Model:
        def chat(self, request: ChatRequest) -> ChatResponse:
            raise AssertionError("streamed")

        async def astream(self, request: ChatRequest) -> AsyncIterator[str | ChatResponse]:
            try:
                yield "Hel"
                yield "lo"
                yield ChatResponse(AiMessage("Hello"))
            finally:
                closed.append("closed")

    class Texts(Protocol):
        def text(self, text: str) -> AsyncIterator[str]: ...

        def events(self, text: str) -> AsyncIterator[StreamEvent]: ...

    bot = ai_service(Texts, model=Model())
    for stream in (bot.text("hi"), bot.events("hi")):
        await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
        assert closed == ["closed"]
        closed.clear()


def test_a_direct_return_after_a_tool_round_streams_only_its_own_result() -> None:
    # The first round's result was for the model; the call's answer is the direct tool's.
    @tool
    def find_id(order: str) -> str:
        """An order's internal id."""
        return "INTERNAL-ID-42"

    @tool(return_direct=True)
    def status(order_id: str) -> str:
        """An order's status."""
        return "Order 42: shipped"

    def requests(*calls: tuple[str, str]) -> AiMessage:
        return AiMessage(
            tool_execution_requests=[ToolExecutionRequest(f"c{n}", *c) for n, c in enumerate(calls)]
        )

    class Orders(Protocol):
        def ask(self, text: str) -> str: ...

        def text(self, text: str) -> Iterator[str]: ...

        def events(self, text: str) -> Iterator[StreamEvent]: ...

    from aiservices.testing import ScriptedChatModel

    answers = []
    for method in ("ask", "text", "events"):
        model = ScriptedChatModel(
            requests(("find_id", '{"order": "42"}')),
            requests(("status", '{"order_id": "INTERNAL-ID-42"}')),
        )
        bot = ai_service(Orders, model=model, tools=[find_id, status])
        out = getattr(bot, method)("order 42?")
        if method == "ask":
            answers.append(out)
        else:
            events = list(out)
            answers.append(
                "".join(e if isinstance(e, str) else getattr(e, "text", "") for e in events)
            )
            if method == "events":
                assert events[-1].result.content == "Order 42: shipped"
    assert answers == ["Order 42: shipped"] * 3


def test_a_sync_event_stream_frames_each_tools_run_with_its_own_events() -> None:
    ran: list[str] = []

    @tool
    def first() -> str:
        """The first."""
        ran.append("first")
        return "1"

    @tool
    def second() -> str:
        """The second."""
        ran.append("second")
        return "2"

    class Two(Protocol):
        def events(self, text: str) -> Iterator[StreamEvent]: ...

    from aiservices.testing import ScriptedChatModel, tool_calls

    model = ScriptedChatModel(tool_calls(("first", {}), ("second", {})), "done")
    bot = ai_service(Two, model=model, tools=[first, second])
    seen: list[Any] = []
    for event in bot.events("go"):
        if isinstance(event, ToolCallStarted):
            seen.append(("started", event.request.name, list(ran)))
        elif isinstance(event, ToolCallFinished):
            seen.append(("finished", event.execution.request.name, list(ran)))
    assert seen == [
        ("started", "first", []),
        ("finished", "first", ["first"]),
        ("started", "second", ["first"]),
        ("finished", "second", ["first", "second"]),
    ]


def test_events_resolve_their_type_hints_and_serialise_as_json() -> None:
    # For a web endpoint that sends each event on (server-sent events, a WebSocket).
    import typing

    from pydantic import TypeAdapter

    from aiservices import TextDelta, ToolCallFinished, ToolCallStarted, TurnCompleted

    for event_type in (TextDelta, ToolCallStarted, ToolCallFinished, TurnCompleted):
        assert typing.get_type_hints(event_type)
    bot = ai_service(
        Bot,
        model=StreamingModel(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[weather],
    )
    adapter = TypeAdapter(StreamEvent)
    sent = [json.loads(adapter.dump_json(e)) for e in bot.events("u", "Weather in Oslo?")]
    (started,) = [e["request"] for e in sent if "request" in e]
    (finished,) = [e["execution"] for e in sent if "execution" in e]
    assert started["name"] == finished["request"]["name"] == "weather"
    assert finished["result"] == "sunny in Oslo"
    assert sent[-1]["result"]["content"] == "It is sunny in Oslo."
    assert sent[-1]["result"]["tool_executions"] == [finished]
    assert "".join(e.get("text", "") for e in sent) == "Let me check. It is sunny in Oslo. "
