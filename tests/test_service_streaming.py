"""Streaming methods: text as it arrives, the turn recorded when the stream ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Protocol

import pytest

from aiservices import (
    AsyncTextStream,
    ChatMemoryAccess,
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    TextStream,
    ai_service,
    tool,
)
from aiservices.models import ChatRequest, ChatResponse, TokenUsage
from aiservices.testing import ScriptedChatModel, tool_call


class Streamer(ChatMemoryAccess, Protocol):
    def tell(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

    def tell_with_usage(self, user: Annotated[str, MemoryId], text: str) -> TextStream: ...

    async def atell(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[str]: ...

    def atell_plain(self, user: Annotated[str, MemoryId], text: str) -> AsyncTextStream: ...


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def make(model: object, **options: object) -> Streamer:
    return ai_service(
        Streamer,
        model=model,
        tools=[weather],  # type: ignore[arg-type]
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50),
        **options,  # type: ignore[arg-type]
    )


def test_sync_stream_yields_chunks_in_order_and_records_the_full_text() -> None:
    bot = make(ScriptedChatModel("Once upon a time", chunk_size=5))
    chunks = list(bot.tell("u", "a story"))
    assert chunks == ["Once ", "upon ", "a tim", "e"]
    assert [m.text for m in bot.get_chat_memory("u").messages()] == ["a story", "Once upon a time"]


def test_nothing_happens_until_the_first_chunk_is_asked_for() -> None:
    model = ScriptedChatModel("hi")
    bot = make(model)
    stream = bot.tell("u", "x")
    assert model.requests == []
    assert next(stream) == "hi"
    stream.close()


def test_text_stream_reports_usage_after_the_end() -> None:
    model = ScriptedChatModel(
        tool_call("weather", city="Oslo"), "It is sunny.", usage=TokenUsage(7, 3)
    )
    bot = make(model)
    stream = bot.tell_with_usage("u", "weather?")
    assert stream.result is None
    assert "".join(stream) == "It is sunny."
    assert stream.result is not None
    assert stream.result.content == "It is sunny."
    assert stream.result.token_usage == TokenUsage(14, 6)
    assert stream.result.tool_executions[0].result == "sunny in Oslo"


def test_a_tool_call_mid_stream_runs_and_the_answer_streams_on() -> None:
    model = ScriptedChatModel(tool_call("weather", city="Rome"), "Sunny in Rome.", chunk_size=6)
    bot = make(model)
    assert "".join(bot.tell("u", "weather in Rome?")) == "Sunny in Rome."
    kinds = [type(m).__name__ for m in bot.get_chat_memory("u").messages()]
    assert kinds == ["UserMessage", "AiMessage", "ToolExecutionResultMessage", "AiMessage"]


def test_closing_early_records_nothing_and_frees_the_conversation() -> None:
    bot = make(ScriptedChatModel("a long answer", "second", chunk_size=2))
    stream = bot.tell("u", "x")
    assert next(stream) == "a "
    stream.close()
    assert bot.get_chat_memory("u").messages() == []
    # the lock was released: the next call on the same id completes
    assert "".join(bot.tell("u", "y")) == "second"


def test_a_stream_closed_by_another_thread_while_read_ends_there_and_records_nothing() -> None:
    bot = make(ScriptedChatModel("a long answer", "second", chunk_size=2, delay=0.3))
    stream = bot.tell("u", "x")
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(stream))
    reader.start()
    time.sleep(0.1)  # the reader waits for the model's first chunk
    stream.close()  # a generator can't be closed while it runs: this one ends at its next chunk
    reader.join(5)
    assert not reader.is_alive()
    assert got == []
    assert bot.get_chat_memory("u").messages() == []
    assert "".join(bot.tell("u", "y")) == "second"


def test_an_async_stream_closed_by_another_task_while_read_ends_there_and_records_nothing() -> None:
    async def main() -> tuple[list[str], list[object], object, str]:
        bot = make(ScriptedChatModel("a long answer", "second", chunk_size=2, delay=0.2))
        stream = bot.atell_plain("u", "x")

        async def read() -> list[str]:
            return [chunk async for chunk in stream]

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.05)  # the reader waits for the model's first chunk
        await stream.aclose()  # a stop button, in a task of its own
        got = await reader
        after = "".join([chunk async for chunk in await bot.atell("u", "y")])
        return got, list(bot.get_chat_memory("u").messages()[:2]), stream.result, after

    got, first_turn, result, after = asyncio.run(main())
    assert got == []
    assert result is None
    assert [m.text for m in first_turn] == ["y", "second"]  # the closed turn left nothing
    assert after == "second"


def test_a_failure_midway_records_nothing() -> None:
    class Broken:
        def chat(self, request: ChatRequest) -> ChatResponse:
            raise AssertionError("streams use stream()")

        def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
            yield "partial "
            raise ConnectionError("dropped")

    bot = make(Broken())
    seen: list[str] = []
    stream = bot.tell("u", "x")
    seen.append(next(stream))
    with pytest.raises(ConnectionError):
        next(stream)
    assert seen == ["partial "]
    assert bot.get_chat_memory("u").messages() == []


def test_a_model_without_stream_gives_one_chunk() -> None:
    class OnlyChat:
        def chat(self, request: ChatRequest) -> ChatResponse:
            return ScriptedChatModel("whole answer").chat(request)

    assert list(make(OnlyChat()).tell("u", "x")) == ["whole answer"]


def test_a_stream_without_its_final_response_is_an_error() -> None:
    class NoFinal:
        def chat(self, request: ChatRequest) -> ChatResponse:
            raise AssertionError

        def stream(self, request: ChatRequest) -> Iterator[str | ChatResponse]:
            yield "text"

    with pytest.raises(RuntimeError, match="final ChatResponse"):
        list(make(NoFinal()).tell("u", "x"))


async def test_async_stream_awaited_then_iterated() -> None:
    bot = make(ScriptedChatModel("async story", chunk_size=6))
    stream = await bot.atell("u", "go")
    assert [c async for c in stream] == ["async ", "story"]
    assert [m.text for m in bot.get_chat_memory("u").messages()] == ["go", "async story"]


async def test_def_returning_async_stream_is_iterated_directly_and_has_a_result() -> None:
    model = ScriptedChatModel(tool_call("weather", city="Paris"), "Sunny.", usage=TokenUsage(1, 1))
    bot = make(model)
    stream = bot.atell_plain("u", "weather?")
    assert "".join([c async for c in stream]) == "Sunny."
    assert stream.result is not None
    assert stream.result.token_usage == TokenUsage(2, 2)


async def test_async_stream_closed_early_records_nothing() -> None:
    bot = make(ScriptedChatModel("abcdef", "next", chunk_size=2))
    stream = bot.atell_plain("u", "x")
    assert await stream.__anext__() == "ab"
    await stream.aclose()
    assert bot.get_chat_memory("u").messages() == []
    assert [c async for c in bot.atell_plain("u", "y")] == ["ne", "xt"]


def test_streaming_declarations_are_checked_at_build() -> None:
    class Bad(Protocol):
        async def a(self, text: str) -> Iterator[str]: ...

        def b(self, text: str) -> Iterator[int]: ...

    with pytest.raises(InterfaceError) as info:
        ai_service(Bad, model=ScriptedChatModel())
    assert [p.split(":")[0] for p in info.value.problems] == ["Bad.a()", "Bad.b()"]


def test_a_direct_return_tool_answer_is_streamed_as_text() -> None:
    @tool(return_direct=True)
    def fetch(key: str) -> str:
        """Fetch a value."""
        return f"value of {key}"

    class Direct(Protocol):
        def ask(self, text: str) -> TextStream: ...

    bot = ai_service(Direct, model=ScriptedChatModel(tool_call("fetch", key="k")), tools=[fetch])
    stream = bot.ask("get k")
    assert list(stream) == ["value of k"]
    assert stream.result is not None
    assert stream.result.content == "value of k"


def test_listeners_hear_about_a_stream_closed_early() -> None:
    from aiservices.observability import CallInfo

    ended: list[str] = []

    class Listener:
        def on_error(self, call: CallInfo, error: BaseException) -> None:
            ended.append(type(error).__name__)

    bot = ai_service(
        Streamer,
        model=ScriptedChatModel("abcdef", chunk_size=2),
        chat_memory_provider=MessageWindowChatMemory.provider(),
        listeners=[Listener()],
    )
    stream = bot.tell("u", "x")
    next(stream)
    stream.close()
    assert ended == ["GeneratorExit"]
