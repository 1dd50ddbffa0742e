"""Tools from a JSON schema: validated arguments, sync and async functions, tool providers."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any, Protocol

import pytest

from aiservices import (
    AiMessage,
    Tool,
    ToolExecutionRequest,
    UserMessage,
    ai_service,
)
from aiservices.testing import ScriptedChatModel

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
    "additionalProperties": False,
}


def forecast(city: str, days: int = 1) -> dict[str, Any]:
    return {"city": city, "days": days, "sky": "clear"}


async def aforecast(city: str, days: int = 1) -> str:
    await asyncio.sleep(0)
    return f"{city}: clear for {days} day(s)"


def _ask(name: str, arguments: str) -> AiMessage:
    return AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", name, arguments)])


class Bot(Protocol):
    def ask(self, text: str) -> str: ...


class AsyncBot(Protocol):
    async def ask(self, text: str) -> str: ...


def test_a_schema_tool_is_offered_as_given_and_called_with_keywords() -> None:
    weather = Tool("weather", "The forecast for a city.", WEATHER_SCHEMA, forecast)
    model = ScriptedChatModel(_ask("weather", '{"city": "Oslo", "days": 3}'), "Clear.")
    bot = ai_service(Bot, model=model, tools=[weather])
    assert bot.ask("Weather in Oslo?") == "Clear."
    (spec,) = model.requests[0].tools
    assert (spec.name, spec.description, spec.parameters) == (
        "weather",
        "The forecast for a city.",
        WEATHER_SCHEMA,
    )
    result = model.requests[1].messages[-1]
    assert result.text == '{"city":"Oslo","days":3,"sky":"clear"}'  # a non-str value as JSON


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ('{"days": 3}', "'city' is a required property"),
        ('{"city": "Oslo", "days": 30}', "days: 30 is greater than the maximum of 7"),
        ('{"city": "Oslo", "when": "now"}', "Additional properties are not allowed"),
        ("not json", "the arguments are not JSON"),
    ],
)
def test_invalid_arguments_go_back_to_the_model_as_the_tools_result(
    arguments: str, detail: str
) -> None:
    called: list[Any] = []
    weather = Tool("weather", "", WEATHER_SCHEMA, lambda **kwargs: called.append(kwargs) or "never")
    model = ScriptedChatModel(_ask("weather", arguments), "Sorry.", check_tools=False)
    bot = ai_service(Bot, model=model, tools=[weather])
    assert bot.ask("Weather?") == "Sorry."
    sent = model.requests[1].messages[-1].text or ""
    assert sent.startswith("Invalid arguments for tool 'weather':")
    assert detail in sent
    assert called == []


def test_an_async_schema_tool_runs_in_sync_and_async_calls() -> None:
    weather = Tool("weather", "", WEATHER_SCHEMA, aforecast)
    model = ScriptedChatModel(
        _ask("weather", '{"city": "Oslo"}'), "ok", _ask("weather", '{"city": "Rome"}'), "ok"
    )
    ai_service(Bot, model=model, tools=[weather]).ask("a")
    asyncio.run(ai_service(AsyncBot, model=model, tools=[weather]).ask("b"))
    assert model.requests[1].messages[-1].text == "Oslo: clear for 1 day(s)"
    assert model.requests[3].messages[-1].text == "Rome: clear for 1 day(s)"


def test_a_tool_provider_may_offer_schema_tools() -> None:
    weather = Tool("weather", "", WEATHER_SCHEMA, forecast)

    def provider(memory_id: Hashable, user: UserMessage) -> list[object]:
        return [weather] if "weather" in user.text else []

    model = ScriptedChatModel(default="ok")
    bot = ai_service(Bot, model=model, tool_provider=provider)
    bot.ask("weather please")
    bot.ask("hello")
    assert [[t.name for t in r.tools] for r in model.requests] == [["weather"], []]


def test_a_bad_schema_tool_fails_when_made() -> None:
    with pytest.raises(ValueError, match="must be an object schema"):
        Tool("weather", "", {"type": "string"}, forecast)
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        Tool("weather", "", {"type": "object", "properties": {"city": {"type": 3}}}, forecast)
    with pytest.raises(ValueError, match="a tool name is 1 to 64"):
        Tool("the weather", "", WEATHER_SCHEMA, forecast)
    with pytest.raises(TypeError, match="function must be callable"):
        Tool("weather", "", WEATHER_SCHEMA, "forecast")  # type: ignore[arg-type]


def test_a_schema_that_cannot_check_the_arguments_tells_the_model() -> None:
    broken = Tool(
        "lookup",
        "",
        {"type": "object", "properties": {"item": {"$ref": "#/$defs/Missing"}}},
        lambda **kwargs: "never",
    )
    model = ScriptedChatModel(_ask("lookup", '{"item": 1}'), "Sorry.")
    assert ai_service(Bot, model=model, tools=[broken]).ask("look it up") == "Sorry."
    sent = model.requests[1].messages[-1].text or ""
    assert sent.startswith("Invalid arguments for tool 'lookup': the tool's schema cannot check")
