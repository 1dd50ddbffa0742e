"""OpenAIChatModel through the real openai SDK against a loopback Chat Completions server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from _loopback import OPENAI_KEY, Reply
from _openai_server import MODEL, OpenAIServer, chunks, completion

from aiservices.messages import (
    AiMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.models import (
    ChatRequest,
    ChatRequestParameters,
    ChatResponse,
    ResponseFormat,
    TokenUsage,
    ToolSpecification,
)
from aiservices.models._strict import is_strict_schema
from aiservices.models.openai import LOCAL_SERVER_API_KEY, OpenAIChatModel

Make = Callable[..., OpenAIChatModel]

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
# A pydantic-style schema: optional field with a default, no additionalProperties.
SEARCH = ToolSpecification(
    "search",
    "Search the web.",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "title": "Query"},
            "limit": {"type": "integer", "default": 5, "title": "Limit"},
        },
        "required": ["query"],
    },
)
VERDICT = ResponseFormat(
    "Verdict",
    {
        "type": "object",
        "properties": {"sentiment": {"type": "string"}, "score": {"type": "number"}},
        "required": ["sentiment", "score"],
        "additionalProperties": False,
    },
    strict=True,
)


def ask(text: str = "Hi", **options: Any) -> ChatRequest:
    return ChatRequest([UserMessage(text)], **options)


def split_stream(items: list[str | ChatResponse]) -> tuple[list[str], ChatResponse]:
    *deltas, final = items
    assert all(isinstance(d, str) for d in deltas)
    assert isinstance(final, ChatResponse)
    return [d for d in deltas if isinstance(d, str)], final


# -- plain calls ---------------------------------------------------------------------------


def test_chat_sends_messages_and_parses_text_usage_and_finish(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text("Hello, Ada!", usage=(12, 4))
    model = openai_model()

    response = model.chat(
        ChatRequest([SystemMessage("Be brief."), UserMessage("Hi, I am Ada", name="Ada")])
    )

    assert response == ChatResponse(AiMessage("Hello, Ada!"), TokenUsage(12, 4), "stop")
    assert openai_server.last.path == "/v1/chat/completions"
    assert openai_server.last.body == {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi, I am Ada", "name": "Ada"},
        ],
    }
    assert openai_server.last.headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_history_with_tool_calls_and_results_maps_to_wire_messages(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text("Warm in both.")
    history = [
        SystemMessage("You know the weather."),
        UserMessage("Weather in Paris and Rome?", name="Ada Lovelace"),
        AiMessage(
            "Checking.",
            [
                ToolExecutionRequest("call_1", "get_weather", '{"city": "Paris"}'),
                ToolExecutionRequest("call_2", "get_weather", '{"city": "Rome"}'),
            ],
        ),
        ToolExecutionResultMessage("call_1", "get_weather", "21C"),
        ToolExecutionResultMessage("call_2", "get_weather", "25C"),
        AiMessage("Warm."),
        AiMessage(None, [ToolExecutionRequest("call_3", "get_weather", '{"city": "Oslo"}')]),
        ToolExecutionResultMessage("call_3", "get_weather", "9C"),
    ]

    openai_model().chat(ChatRequest(history, tools=[WEATHER]))

    assert openai_server.last.body["messages"] == [
        {"role": "system", "content": "You know the weather."},
        # names outside [a-zA-Z0-9_-] are rejected by the API
        {"role": "user", "content": "Weather in Paris and Rome?", "name": "Ada_Lovelace"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
        {"role": "assistant", "content": "Warm."},
        {
            "role": "assistant",
            "content": "",  # not null: llama.cpp refuses it
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "9C"},
    ]


def test_tools_are_function_tools_strict_only_where_the_schema_allows(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text("ok")

    openai_model().chat(ask(tools=[WEATHER, SEARCH]))

    assert openai_server.last.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": dict(WEATHER.parameters),
                "strict": True,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web.",
                "parameters": dict(SEARCH.parameters),
            },
        },
    ]


def test_two_parallel_tool_calls_are_parsed(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_tool_calls(
        [
            ("call_a", "get_weather", '{"city":"Paris"}'),
            ("call_b", "get_weather", '{"city":"Rome"}'),
        ],
        usage=(30, 18),
    )

    response = openai_model().chat(ask(tools=[WEATHER]))

    assert response.ai_message == AiMessage(
        None,
        [
            ToolExecutionRequest("call_a", "get_weather", '{"city":"Paris"}'),
            ToolExecutionRequest("call_b", "get_weather", '{"city":"Rome"}'),
        ],
    )
    assert response.finish_reason == "tool_calls"
    assert response.token_usage == TokenUsage(30, 18)


def test_a_tool_call_without_an_id_gets_one(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    body = completion(None, [("", "get_weather", '{"city":"Oslo"}')], finish_reason="tool_calls")
    body["choices"][0]["message"]["tool_calls"][0]["id"] = None
    openai_server.reply_body(body)

    (request,) = openai_model().chat(ask(tools=[WEATHER])).ai_message.tool_execution_requests

    assert request.id.startswith("call_")
    assert len(request.id) > len("call_")
    assert request.name == "get_weather"


def test_strict_response_format_is_sent_as_strict_json_schema(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text('{"sentiment":"positive","score":0.9}')

    response = openai_model().chat(ask(response_format=VERDICT))

    assert openai_server.last.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Verdict", "schema": dict(VERDICT.schema), "strict": True},
    }
    assert response.ai_message.text == '{"sentiment":"positive","score":0.9}'


def test_non_strict_response_format_falls_back_to_a_best_effort_schema(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text('{"a": 1}')
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}

    openai_model().chat(ask(response_format=ResponseFormat("dict[str, int]", schema)))

    assert openai_server.last.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "dict_str__int_", "schema": schema, "strict": False},
    }


def test_structured_output_off_sends_no_response_format(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text("{}")

    openai_model(structured_output="off").chat(ask(response_format=VERDICT))

    assert "response_format" not in openai_server.last.body


def test_refusal_becomes_the_answer_text(openai_server: OpenAIServer, openai_model: Make) -> None:
    openai_server.reply_text(
        None, refusal="I can't help with that.", finish_reason="content_filter"
    )

    response = openai_model().chat(ask(response_format=VERDICT))

    assert response.ai_message.text == "I can't help with that."
    assert response.finish_reason == "content_filter"


@pytest.mark.parametrize(
    ("wire", "normalised"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("tool_calls", "tool_calls"),
        ("function_call", "tool_calls"),
        ("content_filter", "content_filter"),
        ("eos", "eos"),
    ],
)
def test_finish_reasons_are_normalised(
    openai_server: OpenAIServer, openai_model: Make, wire: str, normalised: str
) -> None:
    openai_server.reply_text("x", finish_reason=wire)

    assert openai_model().chat(ask()).finish_reason == normalised


def test_a_server_without_usage_gives_no_token_usage(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text("x", usage=None)

    assert openai_model().chat(ask()).token_usage is None


def test_a_server_answering_no_choices_is_a_clear_error(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    body = completion("x")
    body["choices"] = []
    openai_server.reply_body(body)

    with pytest.raises(ValueError, match="no choices"):
        openai_model().chat(ask())


def test_a_choice_without_a_message_is_a_clear_error(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    body = completion("x")
    del body["choices"][0]["message"]
    body["choices"][0]["finish_reason"] = "error"
    openai_server.reply_body(body)

    with pytest.raises(ValueError, match=r"a choice without a message \(finish_reason 'error'"):
        openai_model().chat(ask())


def test_a_choice_without_a_message_gives_the_servers_error_in_its_words(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # As a gateway reports a failure of the model behind it in the choice.
    body = completion("x")
    body["choices"][0] = {
        "index": 0,
        "finish_reason": "error",
        "error": {"code": 529, "message": "upstream model overloaded"},
    }
    openai_server.reply_body(body)

    with pytest.raises(ValueError, match=r"\(code 529\): upstream model overloaded"):
        openai_model().chat(ask())


def test_a_stream_where_a_completion_was_due_is_a_clear_error(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(["x"])

    with pytest.raises(ValueError, match="did not answer with a chat completion"):
        openai_model().chat(ask())


# -- parameters ----------------------------------------------------------------------------


def test_request_parameters_override_model_defaults(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_text("a")
    openai_server.reply_text("b")
    model = openai_model(temperature=0.5, top_p=0.9, max_tokens=300, extra={"seed": 7})

    model.chat(ask())
    model.chat(
        ask(
            parameters=ChatRequestParameters(
                temperature=0.1,
                top_p=0.5,
                max_output_tokens=50,
                stop_sequences=["END"],
                extra={"seed": 8, "top_k": 40, "logprobs": True},
            )
        )
    )

    first, second = openai_server.bodies
    assert {k: first[k] for k in ("temperature", "top_p", "max_tokens", "seed")} == {
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 300,
        "seed": 7,
    }
    assert {
        k: second[k] for k in ("temperature", "top_p", "max_tokens", "stop", "seed", "top_k")
    } == {
        "temperature": 0.1,
        "top_p": 0.5,
        "max_tokens": 50,
        "stop": ["END"],
        "seed": 8,
        "top_k": 40,  # not an SDK argument: it travels in the body all the same
    }
    assert second["logprobs"] is True


def test_openai_itself_gets_max_completion_tokens() -> None:
    # api.openai.com cannot be reached here: the SDK's own transport hook answers instead.
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion("ok"))

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        model = OpenAIChatModel(MODEL, api_key=OPENAI_KEY, max_tokens=64, http_client=http)
        model.chat(ask(parameters=ChatRequestParameters(max_output_tokens=32)))
        model.chat(ask())

    assert seen[0]["max_completion_tokens"] == 32
    assert seen[1]["max_completion_tokens"] == 64
    assert "max_tokens" not in seen[0]


# -- streaming -----------------------------------------------------------------------------


def test_stream_yields_text_deltas_then_the_whole_response(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(["Hel", "lo", "!"], usage=(9, 3))

    deltas, final = split_stream(list(openai_model().stream(ask())))

    assert deltas == ["Hel", "lo", "!"]
    assert final == ChatResponse(AiMessage("Hello!"), TokenUsage(9, 3), "stop")
    assert openai_server.last.body["stream"] is True
    assert openai_server.last.body["stream_options"] == {"include_usage": True}


def test_stream_assembles_two_parallel_tool_calls_by_index(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(
        ["Let me check."],
        [
            ("call_a", "get_weather", '{"city": "Paris"}'),
            ("call_b", "get_weather", '{"city": "Rome"}'),
        ],
        split_arguments=4,
    )

    deltas, final = split_stream(list(openai_model().stream(ask(tools=[WEATHER]))))

    assert deltas == ["Let me check."]
    assert final.ai_message == AiMessage(
        "Let me check.",
        [
            ToolExecutionRequest("call_a", "get_weather", '{"city": "Paris"}'),
            ToolExecutionRequest("call_b", "get_weather", '{"city": "Rome"}'),
        ],
    )
    assert final.finish_reason == "tool_calls"


def test_arguments_sent_as_an_object_are_read_as_its_json(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # Some compatible servers send function.arguments as the object, not as JSON text.
    body = completion(None, [("call_a", "get_weather", "")], finish_reason="tool_calls")
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo"}
    openai_server.reply_body(body)
    stream = chunks([], [("call_b", "get_weather", "")], usage=None)
    for chunk in stream:
        for call in chunk["choices"][0]["delta"].get("tool_calls") or ():
            if call.get("function", {}).get("arguments") == "":
                call["function"]["arguments"] = {"city": "Rome"}
    openai_server.reply_raw_stream(stream)

    answer = openai_model().chat(ask(tools=[WEATHER])).ai_message
    _, final = split_stream(list(openai_model().stream(ask(tools=[WEATHER]))))

    assert answer.tool_execution_requests == [
        ToolExecutionRequest("call_a", "get_weather", '{"city": "Oslo"}')
    ]
    assert final.ai_message.tool_execution_requests == [
        ToolExecutionRequest("call_b", "get_weather", '{"city": "Rome"}')
    ]


def test_stream_with_interleaved_tool_call_deltas(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # Arguments of two calls arriving interleaved, as some servers send them.
    a = chunks([], [("call_a", "f", '{"x": 1}')], usage=None, split_arguments=2)
    b = chunks([], [("call_b", "g", '{"y": 2}')], usage=None, split_arguments=2)
    for chunk in b[1:-1]:
        chunk["choices"][0]["delta"]["tool_calls"][0]["index"] = 1
    body = [a[0], a[1], b[1], a[2], b[2], a[3], b[3], a[-1]]
    openai_server.reply_raw_stream(body)

    _, final = split_stream(list(openai_model().stream(ask())))

    assert final.ai_message.tool_execution_requests == [
        ToolExecutionRequest("call_a", "f", '{"x": 1}'),
        ToolExecutionRequest("call_b", "g", '{"y": 2}'),
    ]


def _piece(
    delta: dict[str, Any], finish_reason: str | None = None, index: int = 0
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        ],
    }


def test_a_streamed_refusal_is_streamed_as_the_answers_text(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_raw_stream(
        [
            _piece({"role": "assistant", "content": None, "refusal": "I'm sorry, "}),
            _piece({"refusal": "I can't help."}),
            _piece({}, "stop"),
        ]
    )

    deltas, final = split_stream(list(openai_model().stream(ask())))

    assert "".join(deltas) == final.ai_message.text == "I'm sorry, I can't help."
    assert final.finish_reason == "content_filter"


def test_stream_separates_whole_calls_sent_at_one_index_without_ids(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # As some compatible servers (and gateways in front of them) stream several calls.
    def call(name: str, arguments: str) -> dict[str, Any]:
        function = {"name": name, "arguments": arguments}
        return {"tool_calls": [{"index": 0, "type": "function", "function": function}]}

    openai_server.reply_raw_stream(
        [
            _piece(call("get_weather", '{"city": "Paris"}')),
            _piece(call("get_time", '{"tz": "Asia/Tokyo"}')),
            _piece(call("get_time", '{"tz": "Europe/Oslo"}')),
            _piece(call("get_time", "")),  # a trailing piece that only repeats the name
            _piece({}, "tool_calls"),
        ]
    )

    _, final = split_stream(list(openai_model().stream(ask())))

    assert [(r.name, r.arguments) for r in final.ai_message.tool_execution_requests] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"tz": "Asia/Tokyo"}'),
        ("get_time", '{"tz": "Europe/Oslo"}'),
    ]
    ids = [r.id for r in final.ai_message.tool_execution_requests]
    assert len(set(ids)) == 3


def test_stream_takes_the_first_candidate_as_chat_does(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_raw_stream(
        [
            _piece({"role": "assistant", "content": "Hello "}),
            _piece({"role": "assistant", "content": "Bonjour "}, index=1),
            _piece({"content": "world"}),
            _piece({"content": "le monde"}, index=1),
            _piece({}, "stop"),
            _piece({}, "stop", index=1),
        ]
    )

    deltas, final = split_stream(list(openai_model(extra={"n": 2}).stream(ask())))

    assert deltas == ["Hello ", "world"]
    assert final.ai_message.text == "Hello world"


def test_stream_from_a_server_that_sends_no_usage(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(["ok"], usage=None)

    _, final = split_stream(list(openai_model().stream(ask())))

    assert final.token_usage is None
    assert final.ai_message.text == "ok"


def test_stream_usage_false_omits_stream_options(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(["ok"], usage=None)

    list(openai_model(stream_usage=False).stream(ask()))

    assert "stream_options" not in openai_server.last.body


def test_a_stream_left_early_releases_its_connection(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(["one", "two", "three"])
    openai_server.reply_text("next")
    model = openai_model()

    stream = model.stream(ask())
    assert next(stream) == "one"
    stream.close()

    assert model.chat(ask()).ai_message.text == "next"


# -- async ---------------------------------------------------------------------------------


async def test_achat_and_astream(openai_server: OpenAIServer, openai_model: Make) -> None:
    openai_server.reply_tool_calls([("call_1", "get_weather", '{"city":"Oslo"}')])
    openai_server.reply_stream(["Cold", " there."], usage=(40, 5))

    async with openai_model() as model:
        first = await model.achat(ask(tools=[WEATHER]))
        items = [item async for item in model.astream(ask())]

    assert first.ai_message.tool_execution_requests == [
        ToolExecutionRequest("call_1", "get_weather", '{"city":"Oslo"}')
    ]
    deltas, final = split_stream(items)
    assert deltas == ["Cold", " there."]
    assert final == ChatResponse(AiMessage("Cold there."), TokenUsage(40, 5), "stop")
    assert [b.get("stream") for b in openai_server.bodies] == [None, True]


async def test_astream_assembles_parallel_tool_calls(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_stream(
        [], [("call_a", "get_weather", '{"city":"A"}'), ("call_b", "search", '{"query":"b"}')]
    )

    async with openai_model() as model:
        items = [item async for item in model.astream(ask(tools=[WEATHER, SEARCH]))]

    _, final = split_stream(items)
    assert [(r.id, r.name, r.arguments) for r in final.ai_message.tool_execution_requests] == [
        ("call_a", "get_weather", '{"city":"A"}'),
        ("call_b", "search", '{"query":"b"}'),
    ]
    assert final.ai_message.text is None


def test_async_client_is_made_per_event_loop(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    model = openai_model()
    openai_server.reply_text("one")
    openai_server.reply_text("two")

    async def first() -> str | None:
        text = (await model.achat(ask())).ai_message.text
        # Release the sockets but leave the entry, as a loop that ended without aclose() does.
        client = model._async_clients.current()
        assert client is not None
        await client.close()
        return text

    async def second() -> tuple[str | None, int]:
        try:
            text = (await model.achat(ask())).ai_message.text
            return text, len(model._async_clients)
        finally:
            await model.aclose()

    assert asyncio.run(first()) == "one"
    # A second asyncio.run() works, and the first loop's client is dropped.
    assert asyncio.run(second()) == ("two", 1)


def test_clients_are_made_lazily(openai_server: OpenAIServer, openai_model: Make) -> None:
    model = openai_model()
    assert model._client is None
    openai_server.reply_text("x")

    model.chat(ask())

    assert model._client is not None
    assert len(model._async_clients) == 0


# -- errors, retries, timeouts -------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (401, "invalid_request_error", openai.AuthenticationError),
        (429, "rate_limit_exceeded", openai.RateLimitError),
        (500, "server_error", openai.InternalServerError),
    ],
)
def test_provider_errors_propagate_as_sdk_types(
    openai_server: OpenAIServer,
    openai_model: Make,
    status: int,
    kind: str,
    error: type[Exception],
) -> None:
    openai_server.reply_error(status, f"failed with {status}", kind)
    model = openai_model()

    with pytest.raises(error) as caught:
        model.chat(ask())

    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert len(openai_server.requests) == 1  # max_retries=0 went to the SDK
    assert OPENAI_KEY not in str(caught.value)
    assert OPENAI_KEY not in repr(caught.value)


def test_stream_errors_propagate_as_sdk_types(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_error(429, "slow down", "rate_limit_exceeded")

    with pytest.raises(openai.RateLimitError):
        list(openai_model().stream(ask()))


async def test_async_errors_propagate_as_sdk_types(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    openai_server.reply_error(401, "bad key", "invalid_request_error")
    openai_server.reply_error(500, "boom", "server_error")

    async with openai_model() as model:
        with pytest.raises(openai.AuthenticationError):
            await model.achat(ask())
        with pytest.raises(openai.InternalServerError):
            [item async for item in model.astream(ask())]


def test_max_retries_is_the_sdks(openai_server: OpenAIServer, openai_model: Make) -> None:
    openai_server.reply_error(500, "boom", "server_error", headers={"retry-after-ms": "1"})
    openai_server.reply_text("recovered")

    response = openai_model(max_retries=1).chat(ask())

    assert response.ai_message.text == "recovered"
    assert len(openai_server.requests) == 2


def test_timeout_is_the_sdks(openai_server: OpenAIServer, openai_model: Make) -> None:
    openai_server.queue(Reply(body=completion("late"), delay=1.0))

    with pytest.raises(openai.APITimeoutError):
        openai_model(timeout=0.1).chat(ask())


# -- keys and configuration ----------------------------------------------------------------


def test_the_key_appears_in_no_repr(openai_server: OpenAIServer) -> None:
    model = OpenAIChatModel(
        MODEL, api_key=OPENAI_KEY, base_url=f"http://user:{OPENAI_KEY}@127.0.0.1:1/v1"
    )

    assert OPENAI_KEY not in repr(model)
    assert OPENAI_KEY not in str(model)
    assert repr(model) == f"OpenAIChatModel(model='{MODEL}', base_url='http://***@127.0.0.1:1/v1')"
    # Not even the attributes' reprs show it (a traceback with locals prints them).
    plain = OpenAIChatModel(MODEL, api_key=OPENAI_KEY)
    assert OPENAI_KEY not in repr(vars(plain))


def test_key_comes_from_the_environment(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    openai_server.reply_text("x")

    with OpenAIChatModel(MODEL, base_url=openai_server.base_url) as model:
        model.chat(ask())

    assert openai_server.last.headers["authorization"] == "Bearer sk-from-env"


def test_a_local_server_without_a_key_gets_a_placeholder(openai_server: OpenAIServer) -> None:
    openai_server.reply_text("x")

    with OpenAIChatModel("llama3.1:8b", base_url=openai_server.base_url) as model:
        model.chat(ask())

    assert openai_server.last.headers["authorization"] == f"Bearer {LOCAL_SERVER_API_KEY}"
    assert openai_server.last.body["model"] == "llama3.1:8b"


def test_no_key_and_no_base_url_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIChatModel(MODEL)


def test_handed_in_clients_are_used_and_left_open(openai_server: OpenAIServer) -> None:
    openai_server.reply_text("sync")
    client = openai.OpenAI(api_key=OPENAI_KEY, base_url=openai_server.base_url, max_retries=0)
    try:
        model = OpenAIChatModel(MODEL, client=client)
        assert model.chat(ask()).ai_message.text == "sync"
        model.close()
        assert not client.is_closed()
    finally:
        client.close()


async def test_async_path_follows_a_handed_in_sync_client(openai_server: OpenAIServer) -> None:
    openai_server.reply_text("async")
    client = openai.OpenAI(api_key="sk-handed-in", base_url=openai_server.base_url)
    try:
        async with OpenAIChatModel(MODEL, client=client) as model:
            assert (await model.achat(ask())).ai_message.text == "async"
    finally:
        client.close()

    assert openai_server.last.headers["authorization"] == "Bearer sk-handed-in"


async def test_a_handed_in_azure_client_is_followed_by_an_azure_one(
    openai_server: OpenAIServer,
) -> None:
    # Azure wants its api-version in the query and the key in the api-key header: the
    # async client made beside a sync AzureOpenAI is an AsyncAzureOpenAI.
    openai_server.reply_text("sync")
    openai_server.reply_text("async")
    client = openai.AzureOpenAI(
        api_key="azure-key",
        api_version="2024-10-21",
        azure_endpoint=openai_server.origin,
        azure_deployment="gpt4o",
        max_retries=0,
    )
    try:
        async with OpenAIChatModel(MODEL, client=client) as model:
            model.chat(ask())
            await model.achat(ask())
    finally:
        client.close()
    sync, made = openai_server.requests
    assert (
        made.path
        == sync.path
        == "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
    )
    assert made.headers.get("api-key") == "azure-key"
    assert "authorization" not in made.headers


async def test_an_azure_client_with_an_entra_token_and_a_query_is_followed(
    openai_server: OpenAIServer,
) -> None:
    openai_server.reply_text("async")
    openai_server.reply_text("sync")
    async_client = openai.AsyncAzureOpenAI(
        azure_ad_token_provider=lambda: "entra-token",
        api_version="2025-01-01",
        azure_endpoint=openai_server.origin,
        default_query={"tenant": "acme"},
        max_retries=0,
    )
    async with async_client:
        model = OpenAIChatModel("gpt4o", async_client=async_client)
        await model.achat(ask())
        with model:
            model.chat(ask())
    _, made = openai_server.requests
    assert "api-version=2025-01-01" in made.path
    assert "tenant=acme" in made.path
    assert made.headers["authorization"] == "Bearer entra-token"


async def test_an_async_entra_token_provider_is_refused_by_the_sync_client_made_beside_it(
    openai_server: OpenAIServer,
) -> None:
    async def token() -> str:
        return "entra-token"

    openai_server.reply_text("async")
    async_client = openai.AsyncAzureOpenAI(
        azure_ad_token_provider=token,
        api_version="2025-01-01",
        azure_endpoint=openai_server.origin,
        max_retries=0,
    )
    async with async_client:
        model = OpenAIChatModel("gpt4o", async_client=async_client)
        await model.achat(ask())
        with model, pytest.raises(TypeError, match="pass client=AzureOpenAI"):
            model.chat(ask())
    assert openai_server.last.headers["authorization"] == "Bearer entra-token"


async def test_a_handed_in_clients_query_is_kept_by_the_client_made_beside_it(
    openai_server: OpenAIServer,
) -> None:
    openai_server.reply_text("async")
    client = openai.OpenAI(
        api_key="k", base_url=openai_server.base_url, default_query={"tenant": "t1"}, max_retries=0
    )
    try:
        async with OpenAIChatModel(MODEL, client=client) as model:
            await model.achat(ask())
    finally:
        client.close()
    assert openai_server.last.path == "/v1/chat/completions?tenant=t1"


async def test_a_handed_in_async_client_alone_is_followed_as_a_sync_one_is(
    openai_server: OpenAIServer,
) -> None:
    # A local server's async client: its key, URL and headers are the model's, so the sync
    # client made for chat() goes there too, and max_tokens goes under the field such
    # servers know.
    openai_server.reply_text("async")
    openai_server.reply_text("sync")
    async_client = openai.AsyncOpenAI(
        api_key="sk-local",
        base_url=openai_server.base_url,
        max_retries=0,
        default_headers={"X-Tenant": "acme"},
    )
    async with async_client:
        model = OpenAIChatModel("qwen2.5", async_client=async_client, max_tokens=50)
        assert openai_server.base_url.rstrip("/") in repr(model)
        assert (await model.achat(ask())).ai_message.text == "async"
        with model:
            assert model.chat(ask()).ai_message.text == "sync"
    for sent in openai_server.requests:
        assert sent.headers["authorization"] == "Bearer sk-local"
        assert sent.headers["x-tenant"] == "acme"
        assert sent.body["max_tokens"] == 50
        assert "max_completion_tokens" not in sent.body


async def test_the_async_path_sends_the_headers_of_a_handed_in_sync_client(
    openai_server: OpenAIServer,
) -> None:
    openai_server.reply_text("async")
    client = openai.OpenAI(
        api_key=OPENAI_KEY, base_url=openai_server.base_url, default_headers={"X-Tenant": "acme"}
    )
    try:
        async with OpenAIChatModel(MODEL, client=client) as model:
            await model.achat(ask())
    finally:
        client.close()
    assert openai_server.last.headers["x-tenant"] == "acme"


def test_a_tool_call_without_a_type_is_still_a_tool_call(openai_server: OpenAIServer) -> None:
    # Some compatible servers leave "type" out of a tool call, as the stream's deltas may.
    body = completion(None, finish_reason="tool_calls")
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    openai_server.reply_body(body)
    with OpenAIChatModel(MODEL, base_url=openai_server.base_url, api_key=OPENAI_KEY) as model:
        answer = model.chat(ask()).ai_message
    assert answer.tool_execution_requests == [
        ToolExecutionRequest("call_1", "get_weather", '{"city": "Paris"}')
    ]


def test_an_error_in_a_successful_answer_is_raised_in_the_servers_words(
    openai_server: OpenAIServer,
) -> None:
    # As a gateway answers when the model behind it failed after the answer had begun.
    openai_server.reply_body(
        {"error": {"code": 502, "message": "Upstream provider returned an invalid response"}}
    )
    with (
        OpenAIChatModel(
            MODEL, base_url=openai_server.base_url, api_key=OPENAI_KEY, max_retries=0
        ) as model,
        pytest.raises(ValueError, match=r"\(code 502\): Upstream provider returned an invalid"),
    ):
        model.chat(ask())


def test_options_that_both_handed_in_clients_would_ignore_are_an_error() -> None:
    with (
        openai.OpenAI(api_key=OPENAI_KEY) as client,
        pytest.raises(ValueError, match="api_key, max_retries would go unused") as caught,
    ):
        OpenAIChatModel(
            MODEL,
            client=client,
            async_client=openai.AsyncOpenAI(api_key=OPENAI_KEY),
            api_key=OPENAI_KEY,
            max_retries=3,
        )
    assert OPENAI_KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": ""}, "model must be a non-empty"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout": 0}, "timeout"),
        ({"structured_output": "xml"}, "structured_output"),
    ],
)
def test_bad_options_are_clear_errors(options: dict[str, Any], message: str) -> None:
    model = options.pop("model", MODEL)
    with pytest.raises(ValueError, match=message) as caught:
        OpenAIChatModel(model, api_key=OPENAI_KEY, **options)
    assert OPENAI_KEY not in str(caught.value)


def test_a_wrong_client_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"openai\.OpenAI"):
        OpenAIChatModel(MODEL, client=object())  # type: ignore[arg-type]


# -- the strict-schema rule ----------------------------------------------------------------


def _obj(props: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
        **more,
    }


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        (_obj({"a": {"type": "string"}}), True),
        (_obj({"a": {"type": "array", "items": _obj({"b": {"type": "integer"}})}}), True),
        (_obj({"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}), True),
        (
            _obj({"a": {"$ref": "#/$defs/B"}}, **{"$defs": {"B": _obj({"c": {"type": "number"}})}}),
            True,
        ),
        (_obj({"a": {"type": "string", "format": "date"}}), True),
        (_obj({}), True),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, False),
        ({**_obj({"a": {"type": "string"}}), "required": []}, False),
        (_obj({"a": {"type": "string", "default": "x"}}), False),
        (_obj({"a": {"type": "string", "minLength": 1}}), False),
        (_obj({"a": {"type": "string", "format": "uri"}}), False),
        (_obj({"a": {"type": "array", "items": {"type": "object"}}}), False),
        (_obj({"a": {"allOf": [{"type": "string"}]}}), False),
        ({"type": "array", "items": {"type": "string"}}, False),
        ({"anyOf": [_obj({})]}, False),
        # A parameter of any type: OpenAI answers "schema must have a 'type' key".
        (_obj({"a": {}}), False),
        (_obj({"a": {"description": "anything"}}), False),
        # Nothing may stand beside a reference.
        (
            _obj(
                {"a": {"$ref": "#/$defs/B", "description": "b"}},
                **{"$defs": {"B": _obj({"c": {"type": "number"}})}},
            ),
            False,
        ),
        (_obj({"a": {"type": "string", "enum": [str(i) for i in range(1001)]}}), False),
    ],
)
def test_strict_schema_rule(schema: dict[str, Any], strict: bool) -> None:
    # One rule for tool parameters and answer formats (aiservices.models._strict).
    assert is_strict_schema(schema) is strict


def test_content_sent_as_a_list_of_parts_is_read_as_its_text(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # Some compatible servers send the message's content as parts, reasoning among them.
    body = completion(None)
    body["choices"][0]["message"]["content"] = [
        {"type": "thinking", "thinking": "hmm"},
        {"type": "text", "text": "Hello, "},
        {"type": "text", "text": "there."},
    ]
    openai_server.reply_body(body)
    pieces = chunks([])
    pieces.insert(1, {**pieces[0], "choices": [{"index": 0, "delta": {"content": [
        {"type": "text", "text": "Streamed."}]}, "finish_reason": None}]})  # fmt: skip
    openai_server.reply_raw_stream(pieces)
    model = openai_model()
    assert model.chat(ask()).ai_message.text == "Hello, there."
    *deltas, response = list(model.stream(ask()))
    assert deltas == ["Streamed."]
    assert response.ai_message.text == "Streamed."


def test_a_server_refusing_the_json_schema_format_is_told_the_fix(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # llama.cpp's server: "Input should be 'text' or 'json_object'", in a 500.
    for _ in range(2):
        openai_server.reply_error(
            500, "response_format: Input should be 'text' or 'json_object'", "server_error"
        )
    model = openai_model()
    fmt = ResponseFormat(
        "Verdict", {"type": "object", "properties": {}, "additionalProperties": False}
    )
    with pytest.raises(openai.InternalServerError) as caught:
        model.chat(ask(response_format=fmt))
    assert 'structured_output="json_object"' in "".join(caught.value.__notes__)
    with pytest.raises(openai.InternalServerError) as streamed:
        list(model.stream(ask(response_format=fmt)))
    assert 'structured_output="json_object"' in "".join(streamed.value.__notes__)


def test_the_deprecated_function_call_form_is_read_as_a_tool_call(
    openai_server: OpenAIServer, openai_model: Make
) -> None:
    # Some compatible servers still answer in the single-call form that preceded tool_calls.
    body = completion(None, finish_reason="function_call")
    body["choices"][0]["message"]["function_call"] = {"name": "f", "arguments": '{"a": 1}'}
    openai_server.reply_body(body)
    openai_server.reply_raw_stream(
        [
            _piece({"role": "assistant", "function_call": {"name": "f", "arguments": ""}}),
            _piece({"function_call": {"arguments": '{"a": '}}),
            _piece({"function_call": {"arguments": "1}"}}),
            _piece({}, "function_call"),
        ]
    )
    model = openai_model()

    answered = model.chat(ask())
    _, streamed = split_stream(list(model.stream(ask())))

    for response in (answered, streamed):
        (request,) = response.ai_message.tool_execution_requests
        assert (request.name, request.arguments) == ("f", '{"a": 1}')
        assert request.id.startswith("call_")
        assert response.finish_reason == "tool_calls"
