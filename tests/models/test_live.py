"""The loopback scenarios against the real APIs; each provider's tests run only with its key.

Keys are read when this module is imported (the autouse fixture then hides them from the
loopback tests). ``OPENAI_MODEL`` / ``ANTHROPIC_MODEL`` pick the models.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from aiservices.messages import (
    AiMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.models import ChatRequest, ChatResponse, ResponseFormat, ToolSpecification

OPENAI_KEY = os.environ.get("OPENAI_API_KEY")
ANTHROPIC_KEY = os.environ.get("ANTHROPIC_API_KEY")
OPENAI_MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
ANTHROPIC_MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-haiku-4-5")

pytestmark = pytest.mark.live

WEATHER = ToolSpecification(
    "get_weather",
    "The current weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
CAPITAL = ResponseFormat(
    "Capital",
    {
        "type": "object",
        "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
        "required": ["country", "capital"],
        "additionalProperties": False,
    },
    strict=True,
)


def make(provider: str) -> Any:
    if provider == "openai":
        if not OPENAI_KEY:
            pytest.skip("OPENAI_API_KEY is not set")
        from aiservices.models.openai import OpenAIChatModel

        return OpenAIChatModel(OPENAI_MODEL, api_key=OPENAI_KEY, max_tokens=300)
    if not ANTHROPIC_KEY:
        pytest.skip("ANTHROPIC_API_KEY is not set")
    from aiservices.models.anthropic import AnthropicChatModel

    return AnthropicChatModel(ANTHROPIC_MODEL, api_key=ANTHROPIC_KEY, max_tokens=300)


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])


@PROVIDERS
def test_plain_answer(provider: str) -> None:
    with make(provider) as model:
        response = model.chat(
            ChatRequest(
                [SystemMessage("Answer with one word."), UserMessage("What colour is the sky?")]
            )
        )

    assert "blue" in (response.ai_message.text or "").lower()
    assert response.finish_reason == "stop"
    assert response.token_usage.input_tokens > 0


@PROVIDERS
def test_two_parallel_tool_calls_and_their_results(provider: str) -> None:
    question = UserMessage("What is the weather in Paris and in Rome? Use the tool for each.")
    with make(provider) as model:
        first = model.chat(ChatRequest([question], tools=[WEATHER]))
        requests = first.ai_message.tool_execution_requests
        results = [ToolExecutionResultMessage(r.id, r.name, "21C, sunny") for r in requests]
        second = model.chat(ChatRequest([question, first.ai_message, *results], tools=[WEATHER]))

    assert first.finish_reason == "tool_calls"
    assert sorted(json.loads(r.arguments)["city"] for r in requests) == ["Paris", "Rome"]
    assert "21" in (second.ai_message.text or "")


@PROVIDERS
def test_typed_answer(provider: str) -> None:
    with make(provider) as model:
        response = model.chat(
            ChatRequest([UserMessage("The capital of France?")], response_format=CAPITAL)
        )

    assert json.loads(response.ai_message.text or "")["capital"] == "Paris"


@PROVIDERS
def test_stream(provider: str) -> None:
    with make(provider) as model:
        items = list(model.stream(ChatRequest([UserMessage("Count from 1 to 5.")])))

    *deltas, final = items
    assert isinstance(final, ChatResponse)
    assert "".join(deltas) == final.ai_message.text
    assert "5" in (final.ai_message.text or "")


@PROVIDERS
async def test_async_stream_with_tools(provider: str) -> None:
    async with make(provider) as model:
        items = [
            item
            async for item in model.astream(
                ChatRequest([UserMessage("Weather in Oslo? Use the tool.")], tools=[WEATHER])
            )
        ]

    final = items[-1]
    assert isinstance(final, ChatResponse)
    assert isinstance(final.ai_message, AiMessage)
    (request,) = final.ai_message.tool_execution_requests
    assert json.loads(request.arguments) == {"city": "Oslo"}
