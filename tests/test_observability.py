"""Listeners and the debug log: what a service reports about its calls."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Protocol

import pytest

from aiservices import MemoryId, MessageWindowChatMemory, ai_service, tool
from aiservices.models import ChatRequest, TokenUsage
from aiservices.observability import CallInfo
from aiservices.testing import ScriptedChatModel, tool_call, tool_calls


class Bot(Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


@tool
def shout(word: str) -> str:
    """Upper-case a word."""
    return word.upper()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_call_start(self, call: CallInfo) -> None:
        self.events.append(("call_start", call.memory_id))

    def on_request(self, call: CallInfo, request: Any) -> None:
        self.events.append(("request", len(request.messages)))

    def on_response(self, call: CallInfo, request: Any, response: Any) -> None:
        self.events.append(("response", response.finish_reason))

    def on_tool_start(self, call: CallInfo, request: Any) -> None:
        self.events.append(("tool_start", request.name))

    def on_tool_end(self, call: CallInfo, execution: Any) -> None:
        self.events.append(("tool_end", execution.result))

    def on_call_end(self, call: CallInfo, result: Any) -> None:
        self.events.append(("call_end", result.content))

    def on_error(self, call: CallInfo, error: BaseException) -> None:
        self.events.append(("error", type(error).__name__))


def make(model: ScriptedChatModel, *listeners: object) -> Bot:
    return ai_service(
        Bot,
        model=model,
        tools=[shout],
        listeners=listeners,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )


def test_listeners_see_every_step_in_order() -> None:
    recorder = Recorder()
    bot = make(ScriptedChatModel(tool_call("shout", word="hi"), "HI it is"), recorder)
    bot.chat("ann", "shout hi")
    assert recorder.events == [
        ("call_start", "ann"),
        ("request", 1),
        ("response", "tool_calls"),
        ("tool_start", "shout"),
        ("tool_end", "HI"),
        ("request", 3),
        ("response", "stop"),
        ("call_end", "HI it is"),
    ]


def test_each_tool_is_seen_as_it_starts_and_ends() -> None:
    recorder = Recorder()
    two = tool_calls(("shout", {"word": "a"}), ("shout", {"word": "b"}))
    bot = make(ScriptedChatModel(two, "done"), recorder)
    bot.chat("ann", "shout twice")
    tools = [e for e in recorder.events if e[0].startswith("tool")]
    assert tools == [
        ("tool_start", "shout"),
        ("tool_end", "A"),
        ("tool_start", "shout"),
        ("tool_end", "B"),
    ]


def test_errors_reach_listeners_and_are_raised() -> None:
    recorder = Recorder()
    bot = make(ScriptedChatModel(TimeoutError("slow provider")), recorder)
    with pytest.raises(TimeoutError):
        bot.chat("ann", "hello")
    assert recorder.events[-1] == ("error", "TimeoutError")


def test_a_stream_closed_early_and_a_cancelled_call_reach_on_error() -> None:
    import asyncio
    from collections.abc import Iterator

    class Streaming(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

        async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    class Slow(ScriptedChatModel):
        async def achat(self, request: Any) -> Any:
            await asyncio.sleep(10)

    recorder = Recorder()
    bot = ai_service(
        Streaming,
        model=Slow(default="Hello there, all of you", chunk_size=3),
        listeners=[recorder],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    stream = bot.chat("ann", "hi")
    next(stream)
    stream.close()  # type: ignore[attr-defined]
    assert recorder.events[-1] == ("error", "GeneratorExit")

    async def cancelled() -> None:
        task = asyncio.ensure_future(bot.achat("ann", "hi"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert recorder.events[-1] == ("error", "CancelledError")


def test_a_failing_listener_is_logged_and_does_not_break_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def on_request(self, call: CallInfo, request: Any) -> None:
            raise RuntimeError("listener bug")

    recorder = Recorder()
    bot = make(ScriptedChatModel("fine"), Broken(), recorder)
    with caplog.at_level(logging.ERROR, logger="aiservices"):
        assert bot.chat("ann", "hello") == "fine"
    assert "listener" in caplog.text
    assert ("call_end", "fine") in recorder.events


def test_a_listener_without_hooks_fails_the_build() -> None:
    from aiservices import InterfaceError

    with pytest.raises(InterfaceError, match=r"listeners\[0\]"):
        make(ScriptedChatModel(), object())


def test_a_listener_made_with_autospec_builds_and_is_called() -> None:
    from unittest.mock import create_autospec

    listener = create_autospec(Recorder, instance=True)
    make(ScriptedChatModel("hi"), listener).chat("ann", "hello")
    assert listener.on_call_end.call_count == 1


def test_a_listener_class_or_an_async_hook_fails_the_build() -> None:
    # Passed as a class, each hook would fail at every call; an async hook would never run.
    from aiservices import InterfaceError

    class Timing:
        async def on_call_end(self, call: CallInfo, result: Any) -> None: ...

    with pytest.raises(InterfaceError) as failed:
        make(ScriptedChatModel(), Recorder, Timing())
    assert failed.value.problems == [
        "listeners[0]: Recorder is a class; pass an instance (Recorder())",
        "listeners[1]: on_call_end is async; hooks are plain functions, called without being "
        "awaited (hand slow work to a queue)",
    ]


def test_a_hook_that_cannot_take_its_arguments_or_is_async_on_the_instance_fails_the_build() -> (
    None
):
    # Each would fail (or never run) at every call, logged and nothing more.
    import types

    from aiservices import InterfaceError

    class Forgetful:
        def on_request(self, request: ChatRequest) -> None: ...

        def on_call_end(self, call: CallInfo, result: Any, *, extra: int) -> None: ...

        def on_error(self, *args: Any) -> None: ...  # takes anything: fine

    async def on_response(call: CallInfo, request: ChatRequest, response: Any) -> None: ...

    with pytest.raises(InterfaceError) as failed:
        make(ScriptedChatModel(), Forgetful(), types.SimpleNamespace(on_response=on_response))
    assert failed.value.problems == [
        "listeners[0]: on_request(request: 'ChatRequest') -> 'None' can't take the arguments "
        "it is called with: on_request(call, request)",
        "listeners[0]: on_call_end(call: 'CallInfo', result: 'Any', *, extra: 'int') -> 'None' "
        "can't take the arguments it is called with: on_call_end(call, result)",
        "listeners[1]: on_response is async; hooks are plain functions, called without being "
        "awaited (hand slow work to a queue)",
    ]


def test_another_objects_async_method_set_as_a_hook_fails_the_build() -> None:
    from aiservices import InterfaceError

    class Sink:
        async def report(self, call: CallInfo, result: Any) -> None: ...

    class Forwarding:  # a listener that hands its reports to a sink
        def __init__(self, sink: Sink) -> None:
            self.on_call_end = sink.report

    with pytest.raises(InterfaceError) as failed:
        make(ScriptedChatModel(), Forwarding(Sink()))
    assert failed.value.problems == [
        "listeners[0]: on_call_end is async; hooks are plain functions, called without being "
        "awaited (hand slow work to a queue)",
    ]


def test_debug_log_has_memory_id_and_usage_but_no_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = make(ScriptedChatModel("secret answer", usage=TokenUsage(12, 4)))
    with caplog.at_level(logging.DEBUG, logger="aiservices"):
        bot.chat("ann", "my secret question")
    assert "memory_id='ann'" in caplog.text
    assert "input_tokens=12" in caplog.text
    assert "secret" not in caplog.text


def test_nothing_is_logged_at_info_or_above_for_a_normal_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = make(ScriptedChatModel("ok"))
    with caplog.at_level(logging.INFO, logger="aiservices"):
        bot.chat("ann", "hello")
    assert caplog.records == []


def test_in_an_async_call_each_tool_ends_as_it_finishes() -> None:
    import asyncio

    class AsyncBot(Protocol):
        async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    @tool
    async def late() -> str:
        """Answers after a while."""
        await asyncio.sleep(0.05)
        return "late"

    @tool
    async def early() -> str:
        """Answers at once."""
        return "early"

    recorder = Recorder()
    two = tool_calls(("late", {}), ("early", {}))
    bot = ai_service(
        AsyncBot,
        model=ScriptedChatModel(two, "done"),
        tools=[late, early],
        listeners=[recorder],
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
    )
    asyncio.run(bot.chat("ann", "go"))
    tools = [e for e in recorder.events if e[0].startswith("tool")]
    assert tools == [
        ("tool_start", "late"),
        ("tool_start", "early"),
        ("tool_end", "early"),
        ("tool_end", "late"),
    ]
