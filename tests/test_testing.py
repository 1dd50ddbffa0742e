"""The scripted model users test their services with."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Protocol
from unittest.mock import Mock

import pytest

from aiservices import (
    AiMessage,
    MessageWindowChatMemory,
    UserMessage,
    ai_service,
    tool,
)
from aiservices.models import ChatRequest, ChatResponse, TokenUsage
from aiservices.testing import Interrupted, ScriptedChatModel, tool_call, tool_calls


def request(text: str) -> ChatRequest:
    return ChatRequest([UserMessage(text)])


def test_replies_come_in_order_and_requests_are_recorded() -> None:
    model = ScriptedChatModel(
        "one", AiMessage("two"), ChatResponse(AiMessage("three"), None, "length")
    )
    assert model.chat(request("a")).ai_message.text == "one"
    assert model.chat(request("b")).ai_message == AiMessage("two")
    third = model.chat(request("c"))
    assert third.finish_reason == "length"
    assert [r.messages[0].text for r in model.requests] == ["a", "b", "c"]
    assert model.last_user_text == "c"
    model.assert_all_used()


def test_an_empty_script_fails_loudly_unless_a_default_is_set() -> None:
    model = ScriptedChatModel()
    with pytest.raises(AssertionError, match="no reply left"):
        model.chat(request("x"))
    echo = ScriptedChatModel(default=lambda r: f"echo {r.messages[-1].text}")
    assert echo.chat(request("x")).ai_message.text == "echo x"


def test_exceptions_are_raised_and_usage_is_reported() -> None:
    model = ScriptedChatModel(ValueError("bad"), "ok", usage=TokenUsage(3, 4))
    with pytest.raises(ValueError, match="bad"):
        model.chat(request("x"))
    assert model.chat(request("y")).token_usage == TokenUsage(3, 4)


def test_an_exception_class_is_raised_as_a_reply_and_another_class_is_refused() -> None:
    model = ScriptedChatModel(TimeoutError, "ok")
    with pytest.raises(TimeoutError):
        model.chat(request("x"))
    assert model.chat(request("y")).ai_message.text == "ok"
    with pytest.raises(TypeError, match="the class dict is not a reply"):
        ScriptedChatModel(dict)  # type: ignore[arg-type]


def test_unused_replies_are_reported() -> None:
    model = ScriptedChatModel("a", "b")
    model.chat(request("x"))
    assert model.remaining == 1
    with pytest.raises(AssertionError, match="1 scripted"):
        model.assert_all_used()


def test_tool_call_helpers_make_requests_with_json_arguments() -> None:
    single = tool_call("lookup", order="42")
    assert single.tool_execution_requests[0].name == "lookup"
    assert single.tool_execution_requests[0].arguments == '{"order": "42"}'
    double = tool_calls(("a", {"x": 1}), ("b", {}))
    ids = [r.id for r in double.tool_execution_requests]
    assert len(set(ids)) == 2
    unchecked = ScriptedChatModel(single, check_tools=False)
    assert unchecked.chat(request("x")).finish_reason == "tool_calls"


def test_streams_split_the_text_and_end_with_the_response() -> None:
    model = ScriptedChatModel("abcdefg", chunk_size=3)
    pieces = list(model.stream(request("x")))
    assert pieces[:-1] == ["abc", "def", "g"]
    assert isinstance(pieces[-1], ChatResponse)


async def test_async_paths_and_delay() -> None:
    model = ScriptedChatModel("a", "b", delay=0.01)
    assert (await model.achat(request("x"))).ai_message.text == "a"
    chunks = [c async for c in model.astream(request("y"))]
    assert chunks[0] == "b"
    await asyncio.sleep(0)


def test_sent_texts_summarises_a_request() -> None:
    class Bot(Protocol):
        def chat(self, text: str) -> str: ...

    model = ScriptedChatModel("hello")
    ai_service(Bot, model=model).chat("hi")
    assert model.sent_texts() == [("user", "hi")]


def test_replies_given_as_a_list_are_refused_when_the_model_is_made() -> None:
    with pytest.raises(
        TypeError, match=r"pass the replies one by one: ScriptedChatModel\(\*replies\)"
    ):
        ScriptedChatModel(["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"default=: a reply is"):
        ScriptedChatModel(default=42)  # type: ignore[arg-type]
    model = ScriptedChatModel()
    with pytest.raises(TypeError, match=r"add_replies"):
        model.add_replies(("a",))  # type: ignore[arg-type]


def test_a_callable_reply_may_answer_with_no_text() -> None:
    from aiservices.messages import UserMessage
    from aiservices.models import ChatRequest

    model = ScriptedChatModel(default=lambda request: None)
    assert model.chat(ChatRequest([UserMessage("hi")])).ai_message.text is None


class Helper(Protocol):
    def chat(self, text: str) -> str: ...


@tool
def order_status(order_id: str, verbose: bool = False) -> str:
    """The status of an order."""
    return f"order {order_id}: shipped"


def test_a_scripted_call_of_a_tool_the_request_does_not_offer_fails_the_test() -> None:
    model = ScriptedChatModel(tool_call("order_status", order_id="42"), "It shipped.")
    bot = ai_service(Helper, model=model)  # tools=[...] forgotten
    with pytest.raises(AssertionError, match=r"offers no tools \(pass tools=\[\.\.\.\]"):
        bot.chat("Where is order 42?")
    model = ScriptedChatModel(tool_call("order_stat", order_id="42"), "It shipped.")
    bot = ai_service(Helper, model=model, tools=[order_status])
    with pytest.raises(AssertionError, match=r"'order_stat', but the request offers only "):
        bot.chat("Where is order 42?")


def test_a_scripted_call_with_arguments_its_tool_refuses_fails_the_test() -> None:
    model = ScriptedChatModel(tool_call("order_status", order=42), "It shipped.")
    bot = ai_service(Helper, model=model, tools=[order_status])
    with pytest.raises(AssertionError) as caught:
        bot.chat("Where is order 42?")
    assert "leaves out 'order_id' and passes 'order', which it has not" in str(caught.value)
    assert "(its parameters: 'order_id', 'verbose')" in str(caught.value)


def test_check_tools_false_lets_a_wrong_call_reach_the_service() -> None:
    model = ScriptedChatModel(tool_call("order_stat", id=1), "Sorry.", check_tools=False)
    bot = ai_service(Helper, model=model, tools=[order_status])
    assert bot.chat("Where is order 42?") == "Sorry."
    assert "order_stat" in (model.requests[1].messages[-1].text or "")


def test_a_scripted_call_that_fits_its_tool_runs_it() -> None:
    model = ScriptedChatModel(tool_call("order_status", order_id="42"), "It shipped.")
    bot = ai_service(Helper, model=model, tools=[order_status])
    assert bot.chat("Where is order 42?") == "It shipped."
    assert model.requests[1].messages[-1].text == "order 42: shipped"


def test_an_interrupted_reply_streams_its_text_then_raises_and_nothing_is_recorded() -> None:
    class Writer(Protocol):
        def story(self, text: str) -> Iterator[str]: ...

    model = ScriptedChatModel(Interrupted("Once upon", ConnectionError("dropped")), chunk_size=3)
    memory = MessageWindowChatMemory(max_messages=10)
    writer = ai_service(Writer, model=model, chat_memory=memory)
    got: list[str] = []
    with pytest.raises(ConnectionError, match="dropped"):
        got.extend(writer.story("go"))
    assert got == ["Onc", "e u", "pon"]
    assert memory.messages() == []


async def test_an_interrupted_reply_breaks_async_streams_and_fails_plain_calls() -> None:
    model = ScriptedChatModel(Interrupted("abcd", TimeoutError), Interrupted("ab", OSError("x")))
    got: list[str | ChatResponse] = []

    async def read() -> None:
        async for chunk in model.astream(request("x")):
            got.append(chunk)

    with pytest.raises(TimeoutError):
        await read()
    assert got == ["abcd"]
    with pytest.raises(OSError, match="x"):
        model.chat(request("y"))


def test_a_reply_function_that_returns_a_callable_is_a_type_error() -> None:
    model = ScriptedChatModel(Mock())
    with pytest.raises(TypeError, match=r"returned <Mock .*a callable: a reply function returns"):
        model.chat(request("x"))
    model = ScriptedChatModel(lambda r: ["a", "b"])
    with pytest.raises(TypeError, match=r"a reply function's answer: a reply is"):
        model.chat(request("x"))


def test_sent_texts_without_that_request_and_unused_replies_say_what_is_wrong() -> None:
    model = ScriptedChatModel("first", tool_call("lookup", q=1), "third")
    with pytest.raises(AssertionError, match=r"received 0 request\(s\): there is no request -1"):
        model.sent_texts()
    model.chat(request("x"))
    with pytest.raises(AssertionError) as caught:
        model.assert_all_used()
    assert str(caught.value).startswith("2 scripted replies were not used: AiMessage(")
    assert str(caught.value).endswith(", 'third'")
