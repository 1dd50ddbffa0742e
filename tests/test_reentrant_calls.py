"""A call made from inside a call on the same conversation (by its tool, guardrail or
retriever, or by the code reading its stream) is refused at once instead of waiting for
itself forever."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, Protocol

import pytest

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    MemoryId,
    MessageWindowChatMemory,
    StreamEvent,
    TextDelta,
    TurnCompleted,
    ai_service,
    tool,
    user_message,
)
from aiservices.testing import ScriptedChatModel, tool_call


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread; fails the test instead of hanging it."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(("value", call()))
        except BaseException as error:
            outcome.append(("error", error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the call still waited after {seconds} s"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


class Assistant(ChatMemoryAccess, Protocol):
    def chat(self, message: str) -> str: ...

    @user_message("Classify the sentiment of: {{text}}")
    def classify(self, text: str) -> str: ...


def test_a_tool_calling_its_services_shared_conversation_is_refused() -> None:
    bots: list[Assistant] = []

    @tool
    def sentiment(text: str) -> str:
        """The sentiment of a text."""
        return bots[0].classify(text)

    model = ScriptedChatModel(tool_call("sentiment", text="I love it"), "fine")
    bot = ai_service(
        Assistant, model=model, chat_memory=MessageWindowChatMemory(20), tools=[sentiment]
    )
    bots.append(bot)
    with pytest.raises(RuntimeError, match="from inside a call that holds it") as info:
        _within(10, lambda: bot.chat("How does this review sound?"))
    assert "'default'" in str(info.value)
    # Refused, not sent to the model as the tool's error: the model was asked once.
    assert len(model.requests) == 1
    # The conversation is free again and records nothing of the failed call.
    assert bot.get_chat_memory("default").messages() == []
    assert _within(10, lambda: bot.chat("hi")) == "fine"


class Users(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    async def achat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def test_async_and_threaded_tools_calling_back_are_refused() -> None:
    bots: list[Users] = []

    @tool
    async def ask_async(user: Annotated[str, MemoryId]) -> str:
        """Ask again."""
        return await bots[0].achat(user, "inner")

    @tool
    def ask_sync(user: Annotated[str, MemoryId]) -> str:
        """Ask again, blocking (run in a worker thread by an async call)."""
        return bots[0].chat(user, "inner")

    for name in ("ask_async", "ask_sync"):
        model = ScriptedChatModel(tool_call(name), "outer")
        bot = ai_service(
            Users,
            model=model,
            tools=[ask_async, ask_sync],
            chat_memory_provider=MessageWindowChatMemory.provider(20),
        )
        bots[:] = [bot]
        with pytest.raises(RuntimeError, match="conversation 'u' was made from inside"):
            _within(10, lambda: asyncio.run(bot.achat("u", "hi")))  # noqa: B023


def test_a_tool_may_call_its_service_on_another_conversation() -> None:
    bots: list[Users] = []

    @tool
    def ask_other() -> str:
        """Ask in another conversation."""
        return bots[0].chat("other", "inner")

    model = ScriptedChatModel(tool_call("ask_other"), "inner answer", "outer answer")
    bot = ai_service(
        Users,
        model=model,
        tools=[ask_other],
        chat_memory_provider=MessageWindowChatMemory.provider(20),
    )
    bots.append(bot)
    assert _within(10, lambda: bot.chat("u", "hi")) == "outer answer"
    assert [m.text for m in bot.get_chat_memory("other").messages()] == ["inner", "inner answer"]


def test_a_guardrail_calling_back_is_refused() -> None:
    bots: list[Users] = []

    def judge(answer: AiMessage) -> None:
        bots[0].chat("u", f"Is this fine? {answer.text}")

    model = ScriptedChatModel("outer", "yes")
    bot = ai_service(
        Users,
        model=model,
        output_guardrails=[judge],
        chat_memory_provider=MessageWindowChatMemory.provider(20),
    )
    bots.append(bot)
    with pytest.raises(RuntimeError, match="from inside a call that holds it"):
        _within(10, lambda: bot.chat("u", "hi"))


def test_a_task_a_tool_leaves_running_waits_its_turn_afterwards() -> None:
    # Started by a tool, it runs after the turn ended: then it is a caller like any other,
    # and waits for whoever holds the conversation instead of being refused.
    bots: list[Users] = []
    started: list[asyncio.Task[str]] = []

    class SlowOnBusy:
        """Answers from a script; the request ending in "busy" takes a while."""

        def __init__(self) -> None:
            self.script = ScriptedChatModel(tool_call("spawn"), "outer", "slow", "follow-up")

        def chat(self, request: Any) -> Any:
            return self.script.chat(request)

        async def achat(self, request: Any) -> Any:
            if request.messages[-1].text == "busy":
                await asyncio.sleep(0.1)
            return self.script.chat(request)

    async def scenario() -> list[str]:
        gate = asyncio.Event()

        async def later(user: str) -> str:
            await gate.wait()
            return await bots[0].achat(user, "later")

        @tool
        async def spawn(user: Annotated[str, MemoryId]) -> str:
            """Start a follow-up."""
            started.append(asyncio.create_task(later(user)))
            return "started"

        bot = ai_service(
            Users,
            model=SlowOnBusy(),
            tools=[spawn],
            chat_memory_provider=MessageWindowChatMemory.provider(20),
        )
        bots.append(bot)
        first = await bot.achat("u", "hi")
        holder = asyncio.create_task(bot.achat("u", "busy"))
        await asyncio.sleep(0.02)  # the holder now waits for its model, the conversation held
        gate.set()
        answers = [first, await holder, await started[0]]
        return [*answers, str(len(bot.get_chat_memory("u").messages()))]

    assert _within(10, lambda: asyncio.run(scenario())) == ["outer", "slow", "follow-up", "8"]


class Streams(Protocol):
    def events(self, user: Annotated[str, MemoryId], text: str) -> Iterator[StreamEvent]: ...

    def tell(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    async def aevents(
        self, user: Annotated[str, MemoryId], text: str
    ) -> AsyncIterator[StreamEvent]: ...

    async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def _streams() -> Any:
    return ai_service(
        Streams,
        model=ScriptedChatModel(default="hello there world", chunk_size=6),
        chat_memory_provider=MessageWindowChatMemory.provider(20),
    )


def test_a_stream_reader_calling_its_conversation_before_the_end_is_refused() -> None:
    # The stream holds the conversation until its turn is recorded, and only its reader can
    # move it on: a call the reader makes on it meanwhile would wait forever.
    def scenario() -> list[str]:
        bot = _streams()
        refused: list[str] = []
        stream = bot.events("ada", "hi")
        for event in stream:
            if isinstance(event, TextDelta):
                with pytest.raises(RuntimeError, match="code reading its stream"):
                    bot.chat("ada", "and this?")
                refused.append(event.text)
            elif isinstance(event, TurnCompleted):
                refused.append(bot.chat("ada", "now?"))  # recorded by now: no wait
        texts = [m.text for m in bot.get_chat_memory("ada").messages()]
        return [*refused, *map(str, texts)]

    assert _within(10, scenario) == [
        "hello ",
        "there ",
        "world",
        "hello there world",
        "hi",
        "hello there world",
        "now?",
        "hello there world",
    ]


def test_a_text_stream_reader_calling_back_is_refused_and_the_stream_goes_on() -> None:
    def scenario() -> str:
        bot = _streams()
        chunks = []
        for chunk in bot.tell("ada", "hi"):
            chunks.append(chunk)
            with pytest.raises(RuntimeError, match="would wait for itself"):
                bot.chat("ada", "and this?")
        return "".join(chunks)

    assert _within(10, scenario) == "hello there world"


def test_an_async_stream_reader_awaiting_its_conversation_is_refused() -> None:
    async def scenario() -> list[str]:
        bot = _streams()
        seen = []
        async for event in await bot.aevents("ada", "hi"):
            if isinstance(event, TextDelta):
                with pytest.raises(RuntimeError, match="code reading its stream"):
                    await bot.achat("ada", "and this?")
                seen.append(event.text)
        seen.append(await bot.achat("ada", "after"))
        return seen

    assert _within(10, lambda: asyncio.run(scenario())) == [
        "hello ",
        "there ",
        "world",
        "hello there world",
    ]


def test_two_streams_read_in_turn_each_refuse_their_reader_calling_back() -> None:
    # Each stream marks its reader while it hands over a piece, and the marks are left in
    # another order than they were made: leaving one must not drop the other.
    def scenario() -> list[str]:
        bot = _streams()
        refused = []
        for n, (a, b) in enumerate(zip(bot.tell("ada", "hi"), bot.tell("bob", "hi"), strict=True)):
            if n == 1:
                for user in ("ada", "bob"):
                    with pytest.raises(RuntimeError, match="would wait for itself"):
                        bot.chat(user, "and this?")
                    refused.append(user)
            refused.append(a + b)
        return refused

    assert _within(10, scenario) == ["hello hello ", "ada", "bob", "there there ", "worldworld"]


def test_two_async_streams_read_in_turn_each_refuse_their_reader_calling_back() -> None:
    async def scenario() -> list[str]:
        bot = _streams()
        first, second = await bot.aevents("ada", "hi"), await bot.aevents("bob", "hi")
        await anext(first)
        await anext(second)
        await anext(first)
        refused = []
        for user in ("ada", "bob"):
            with pytest.raises(RuntimeError, match="code reading its stream"):
                await bot.achat(user, "and this?")
            refused.append(user)
        await first.aclose()
        await second.aclose()
        return refused

    assert _within(10, lambda: asyncio.run(scenario())) == ["ada", "bob"]


def test_a_stream_read_on_by_another_thread_lets_its_first_reader_wait() -> None:
    # Begun on one thread and handed to another: the first thread is no longer its reader,
    # and a call it makes on the conversation waits for the stream instead of being refused.
    def scenario() -> list[str]:
        bot = _streams()
        stream = bot.tell("ada", "hi")
        first = next(stream)
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.extend(stream))
        reader.start()
        answer = bot.chat("ada", "after the stream")
        reader.join()
        return [first + "".join(rest), answer, str(len(bot.get_chat_memory("ada").messages()))]

    assert _within(10, scenario) == ["hello there world", "hello there world", "4"]
