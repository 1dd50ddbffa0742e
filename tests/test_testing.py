"""The scripted model users test their services with."""

from __future__ import annotations

import asyncio
from typing import Protocol

import pytest

from aiservices import AiMessage, UserMessage, ai_service
from aiservices.models import ChatRequest, ChatResponse, TokenUsage
from aiservices.testing import ScriptedChatModel, tool_call, tool_calls


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
    assert ScriptedChatModel(single).chat(request("x")).finish_reason == "tool_calls"


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
