"""A service with memory, a tool round trip and a typed answer, on each provider's wire."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, Protocol

import pytest
from _anthropic_server import AnthropicServer, text, tool_use
from _openai_server import OpenAIServer
from pydantic import BaseModel

from aiservices import MemoryId, MessageWindowChatMemory, ai_service, system_message, tool
from aiservices.messages import AiMessage, ToolExecutionRequest, ToolExecutionResultMessage
from aiservices.messages import SystemMessage as System
from aiservices.messages import UserMessage as User


class Verdict(BaseModel):
    sentiment: str
    score: float


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"21C and sunny in {city}"


@system_message("You are a weather assistant.")
class Assistant(Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    async def achat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    def classify(self, text: str) -> Verdict: ...


def build(model: Any) -> Assistant:
    return ai_service(
        Assistant,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20),
        tools=[get_weather],
    )


# What memory holds after the first turn, on either provider.
def first_turn(call_id: str, arguments: str) -> list[Any]:
    return [
        System("You are a weather assistant."),
        User("Weather in Paris?"),
        AiMessage(None, [ToolExecutionRequest(call_id, "get_weather", arguments)]),
        ToolExecutionResultMessage(call_id, "get_weather", "21C and sunny in Paris"),
        AiMessage("Sunny, 21C."),
    ]


def test_openai_service_round_trip(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    openai_server.reply_tool_calls([("call_1", "get_weather", '{"city":"Paris"}')])
    openai_server.reply_text("Sunny, 21C.")
    openai_server.reply_text("You asked about Paris.")
    bot = build(openai_model())

    assert bot.chat("alice", "Weather in Paris?") == "Sunny, 21C."
    assert bot.chat("alice", "What did I ask?") == "You asked about Paris."

    first, second, third = openai_server.bodies
    (weather,) = first["tools"]
    assert weather["function"]["name"] == "get_weather"
    assert weather["function"]["parameters"]["properties"]["city"]["type"] == "string"
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": "",  # not null: llama.cpp refuses it
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21C and sunny in Paris"},
    ]
    # The second call sees the whole first turn from memory.
    assert [m["role"] for m in third["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    memory = bot.get_chat_memory("alice")  # type: ignore[attr-defined]
    assert memory.messages()[:5] == first_turn("call_1", '{"city":"Paris"}')


async def test_openai_async_service_and_typed_answer(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    openai_server.reply_tool_calls([("call_1", "get_weather", '{"city":"Paris"}')])
    openai_server.reply_text("Sunny, 21C.")
    openai_server.reply_text('{"sentiment": "positive", "score": 0.8}')
    async with openai_model() as model:
        bot = build(model)
        assert await bot.achat("bob", "Weather in Paris?") == "Sunny, 21C."
        verdict = bot.classify("What a lovely day")

    assert verdict == Verdict(sentiment="positive", score=0.8)
    response_format = openai_server.bodies[2]["response_format"]
    assert response_format["type"] == "json_schema"
    assert set(response_format["json_schema"]["schema"]["properties"]) == {"sentiment", "score"}


def test_anthropic_service_round_trip(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any]
) -> None:
    anthropic_server.reply_message(
        [tool_use("toolu_1", "get_weather", {"city": "Paris"})], stop_reason="tool_use"
    )
    anthropic_server.reply_text("Sunny, 21C.")
    anthropic_server.reply_text("You asked about Paris.")
    bot = build(anthropic_model())

    assert bot.chat("alice", "Weather in Paris?") == "Sunny, 21C."
    assert bot.chat("alice", "What did I ask?") == "You asked about Paris."

    first, second, third = anthropic_server.bodies
    assert first["system"] == "You are a weather assistant."
    assert [t["name"] for t in first["tools"]] == ["get_weather"]
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "21C and sunny in Paris",
                }
            ],
        },
    ]
    assert [m["role"] for m in third["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    memory = bot.get_chat_memory("alice")  # type: ignore[attr-defined]
    assert memory.messages()[:5] == first_turn("toolu_1", '{"city": "Paris"}')


async def test_anthropic_async_service_and_typed_answer(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any]
) -> None:
    anthropic_server.reply_message(
        [text("Let me look."), tool_use("toolu_1", "get_weather", {"city": "Paris"})],
        stop_reason="tool_use",
    )
    anthropic_server.reply_text("Sunny, 21C.")
    anthropic_server.reply_message(
        [tool_use("toolu_v", "Verdict", {"sentiment": "positive", "score": 0.8})],
        stop_reason="tool_use",
    )
    async with anthropic_model() as model:
        bot = build(model)
        assert await bot.achat("bob", "Weather in Paris?") == "Sunny, 21C."
        verdict = bot.classify("What a lovely day")

    assert verdict == Verdict(sentiment="positive", score=0.8)
    typed = anthropic_server.bodies[2]
    # The service's tools stay on offer, so the answer tool is one choice among them.
    assert typed["tool_choice"] == {"type": "any"}
    assert [t["name"] for t in typed["tools"]] == ["get_weather", "Verdict"]
    assert set(typed["tools"][1]["input_schema"]["properties"]) == {"sentiment", "score"}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_provider_error_leaves_memory_unchanged(
    provider: str,
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
) -> None:
    import anthropic
    import openai

    if provider == "openai":
        openai_server.reply_tool_calls([("call_1", "get_weather", '{"city":"Paris"}')])
        openai_server.reply_error(429, "slow down", "rate_limit_exceeded")
        bot, error = build(openai_model()), openai.RateLimitError
    else:
        anthropic_server.reply_message(
            [tool_use("toolu_1", "get_weather", {"city": "Paris"})], stop_reason="tool_use"
        )
        anthropic_server.reply_error(429, "rate_limit_error", "slow down")
        bot, error = build(anthropic_model()), anthropic.RateLimitError

    with pytest.raises(error):
        bot.chat("carol", "Weather in Paris?")

    assert bot.get_chat_memory("carol").messages() == []  # type: ignore[attr-defined]


class Teller(Protocol):
    def tell(self, message: str) -> Iterator[str]: ...

    def atell(self, message: str) -> AsyncIterator[str]: ...


def test_service_streams_on_both_providers(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
) -> None:
    openai_server.reply_stream(["Once ", "upon ", "a time."])
    anthropic_server.reply_stream([text("Once upon a time.")])

    on_openai = ai_service(Teller, model=openai_model())
    on_anthropic = ai_service(Teller, model=anthropic_model())

    assert list(on_openai.tell("A story")) == ["Once ", "upon ", "a time."]
    assert "".join(on_anthropic.tell("A story")) == "Once upon a time."
    assert openai_server.last.body["stream"] is True
    assert anthropic_server.last.body["stream"] is True


async def test_service_streams_async_on_both_providers(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
) -> None:
    openai_server.reply_stream(["Once ", "upon ", "a time."])
    anthropic_server.reply_stream([text("Once upon a time.")])

    async with openai_model() as on_openai, anthropic_model() as on_anthropic:
        first = [d async for d in ai_service(Teller, model=on_openai).atell("A story")]
        second = [d async for d in ai_service(Teller, model=on_anthropic).atell("A story")]

    assert first == ["Once ", "upon ", "a time."]
    assert "".join(second) == "Once upon a time."


def test_service_streams_through_a_tool_round_trip_on_both_providers(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
) -> None:
    openai_server.reply_stream([], [("call_1", "get_weather", '{"city": "Paris"}')])
    openai_server.reply_stream(["Sunny, ", "21C."])
    anthropic_server.reply_stream([tool_use("toolu_1", "get_weather", {"city": "Paris"})])
    anthropic_server.reply_stream([text("Sunny, 21C.")])

    for model in (openai_model(), anthropic_model()):
        teller = ai_service(Teller, model=model, tools=[get_weather])
        assert "".join(teller.tell("Weather in Paris?")) == "Sunny, 21C."

    openai_result = openai_server.bodies[1]["messages"][-1]
    anthropic_result = anthropic_server.bodies[1]["messages"][-1]["content"][0]
    assert openai_result["content"] == anthropic_result["content"] == "21C and sunny in Paris"


def test_a_stream_closed_early_records_nothing_on_both_providers(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
) -> None:
    openai_server.reply_stream(["Once ", "upon ", "a time."])
    anthropic_server.reply_stream([text("Once upon a time.")])
    for model in (openai_model(), anthropic_model()):
        memory = MessageWindowChatMemory(10)
        stream = ai_service(Teller, model=model, chat_memory=memory).tell("A story")
        assert next(stream)
        stream.close()
        assert memory.messages() == []


def test_a_stream_failing_midway_records_nothing_on_both_providers(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
) -> None:
    openai_server.reply_stream(["Once ", "upon ", "a time."])
    openai_server.break_last_stream(after_events=2)
    openai_server.reply_stream(["Again."])
    anthropic_server.reply_stream([text("Once upon a time.")])
    anthropic_server.break_last_stream(after_events=3)
    anthropic_server.reply_stream([text("Again.")])
    for model in (openai_model(max_retries=0), anthropic_model(max_retries=0)):
        memory = MessageWindowChatMemory(10)
        teller = ai_service(Teller, model=model, chat_memory=memory)
        received: list[str] = []
        # Each SDK raises its own error type for a dropped stream.
        with pytest.raises(Exception) as failure:
            received.extend(teller.tell("A story"))
        assert not isinstance(failure.value, AssertionError), failure.value
        assert memory.messages() == []
        assert "".join(teller.tell("Try again")) == "Again."
        assert [m.text for m in memory.messages()] == ["Try again", "Again."]
