"""Tool choice: sent whenever tools are offered and never without them, on both providers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pytest
from _anthropic_server import AnthropicServer
from _openai_server import OpenAIServer

from aiservices.messages import UserMessage
from aiservices.models import ChatRequest, ChatRequestParameters, ToolSpecification

WEATHER = ToolSpecification(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
ASK = [UserMessage("Weather in Oslo?")]


@pytest.mark.parametrize(
    ("parameters", "choice", "parallel"),
    [
        (ChatRequestParameters(), "auto", None),
        (ChatRequestParameters(tool_choice="required"), "required", None),
        (ChatRequestParameters(tool_choice="none", parallel_tool_calls=False), "none", False),
        (
            ChatRequestParameters(tool_choice="get_weather"),
            {"type": "function", "function": {"name": "get_weather"}},
            None,
        ),
    ],
)
def test_openai_requests_with_tools_carry_a_tool_choice(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    parameters: ChatRequestParameters,
    choice: Any,
    parallel: bool | None,
) -> None:
    model = openai_model()
    openai_server.reply_text("ok")
    model.chat(ChatRequest(ASK, [WEATHER], parameters=parameters))
    body = openai_server.last.body
    assert body["tool_choice"] == choice
    assert body.get("parallel_tool_calls") == parallel
    # The tool's schema qualifies for strict mode, checked by the one rule.
    assert body["tools"][0]["function"]["strict"] is True


def test_openai_requests_without_tools_carry_no_tool_options(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    model = openai_model()
    openai_server.reply_text("ok")
    parameters = ChatRequestParameters(tool_choice="required", parallel_tool_calls=False)
    model.chat(ChatRequest(ASK, [], parameters=parameters))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(openai_server.last.body)


def test_a_schema_openai_strict_mode_refuses_is_sent_without_strict(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    anything = ToolSpecification(
        "note", "", {"type": "object", "properties": {"value": {}}, "required": ["value"]}
    )
    model = openai_model()
    openai_server.reply_text("ok")
    model.chat(ChatRequest(ASK, [anything]))
    assert "strict" not in openai_server.last.body["tools"][0]["function"]


@pytest.mark.parametrize(
    ("parameters", "choice"),
    [
        (ChatRequestParameters(), None),
        (ChatRequestParameters(tool_choice="required"), {"type": "any"}),
        (ChatRequestParameters(tool_choice="none"), {"type": "none"}),
        (ChatRequestParameters(tool_choice="get_weather"), {"type": "tool", "name": "get_weather"}),
        (
            ChatRequestParameters(parallel_tool_calls=False),
            {"type": "auto", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_anthropic_maps_the_tool_choice(
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
    parameters: ChatRequestParameters,
    choice: Any,
) -> None:
    model = anthropic_model()
    anthropic_server.reply_text("ok")
    model.chat(ChatRequest(ASK, [WEATHER], parameters=parameters))
    assert anthropic_server.last.body.get("tool_choice") == choice
    anthropic_server.reply_text("ok")
    model.chat(ChatRequest(ASK, [], parameters=parameters))
    assert "tool_choice" not in anthropic_server.last.body


def test_a_tool_choice_must_be_a_name() -> None:
    with pytest.raises(ValueError, match="tool_choice must be"):
        ChatRequestParameters(tool_choice="")


def test_stop_sequences_given_as_one_string_are_refused() -> None:
    # Taken as a sequence, "END" would stop the answer at any E, N or D.
    with pytest.raises(TypeError, match=r"stop_sequences=\['END'\]"):
        ChatRequestParameters(stop_sequences="END")
    assert ChatRequestParameters(stop_sequences=["END"]).stop_sequences == ["END"]


def test_a_json_object_format_carries_the_schema_for_llama_cpp_style_servers(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    from aiservices.models import ResponseFormat

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    model = openai_model(structured_output="json_object")
    openai_server.reply_text('{"city": "Paris"}')
    model.chat(ChatRequest(ASK, response_format=ResponseFormat("City", schema, strict=True)))
    assert openai_server.last.body["response_format"] == {"type": "json_object", "schema": schema}


def test_a_forcing_tool_choice_holds_for_the_first_answer_only() -> None:
    from aiservices import AiMessage, ToolExecutionRequest, ai_service, tool
    from aiservices.testing import ScriptedChatModel

    @tool
    def get_weather(city: str) -> str:
        """The weather."""
        return "sunny"

    class Bot(Protocol):
        def ask(self, text: str) -> str: ...

    model = ScriptedChatModel(
        AiMessage(
            tool_execution_requests=[ToolExecutionRequest("c", "get_weather", '{"city": "Oslo"}')]
        ),
        "Sunny.",
    )
    bot = ai_service(
        Bot,
        model=model,
        tools=[get_weather],
        parameters=ChatRequestParameters(tool_choice="required"),
    )
    assert bot.ask("Weather?") == "Sunny."
    assert [r.parameters.tool_choice for r in model.requests] == ["required", "auto"]


def test_a_tool_choice_naming_a_tool_not_offered_is_an_error(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    with pytest.raises(ValueError, match="names no tool offered in this request"):
        openai_model().chat(
            ChatRequest(ASK, [WEATHER], parameters=ChatRequestParameters(tool_choice="lookup"))
        )
    assert openai_server.requests == []


def test_anthropic_none_and_the_output_tool(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any]
) -> None:
    from aiservices.models import ResponseFormat

    model = anthropic_model()
    anthropic_server.reply_text("ok")
    parameters = ChatRequestParameters(tool_choice="none", parallel_tool_calls=False)
    model.chat(ChatRequest(ASK, [WEATHER], parameters=parameters))
    assert anthropic_server.last.body["tool_choice"] == {"type": "none"}  # no parallel flag
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    anthropic_server.reply_message(
        [{"type": "tool_use", "id": "t", "name": "Answer", "input": {"a": "x"}}],
        stop_reason="tool_use",
    )
    fmt = ResponseFormat("Answer", schema)
    model.chat(ChatRequest(ASK, [WEATHER], fmt, ChatRequestParameters(tool_choice="none")))
    # No tool of the user's, and the answer still comes through the output tool.
    assert anthropic_server.last.body["tool_choice"] == {"type": "tool", "name": "Answer"}
