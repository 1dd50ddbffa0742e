"""AnthropicChatModel through the real anthropic SDK against a loopback Messages server."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import anthropic
import pytest
from _anthropic_server import MODEL, AnthropicServer, message, text, tool_use
from _loopback import ANTHROPIC_KEY, Reply

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
from aiservices.models.anthropic import (
    DEFAULT_MAX_TOKENS,
    AnthropicChatModel,
    AnthropicTokenCountEstimator,
)

Make = Callable[..., AnthropicChatModel]

WEATHER = ToolSpecification(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"sentiment": {"type": "string"}, "score": {"type": "number"}},
    "required": ["sentiment", "score"],
    "additionalProperties": False,
}
VERDICT = ResponseFormat("Verdict", VERDICT_SCHEMA, strict=True)


def ask(value: str = "Hi", **options: Any) -> ChatRequest:
    return ChatRequest([UserMessage(value)], **options)


def _sent_key(server: AnthropicServer) -> str:
    return _sent_key_of(server.last.headers)


def _sent_key_of(headers: Mapping[str, str]) -> str:
    # SDK versions differ: x-api-key, or a bearer authorization header.
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


def split_stream(items: list[str | ChatResponse]) -> tuple[list[str], ChatResponse]:
    *deltas, final = items
    assert all(isinstance(d, str) for d in deltas)
    assert isinstance(final, ChatResponse)
    return [d for d in deltas if isinstance(d, str)], final


# -- plain calls ---------------------------------------------------------------------------


def test_chat_sends_system_on_top_and_parses_text_usage_and_stop(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text("Hello, Ada!", usage={"input_tokens": 30, "output_tokens": 6})

    response = anthropic_model().chat(
        ChatRequest([SystemMessage("Be brief."), UserMessage("Hi, I am Ada", name="Ada")])
    )

    assert response == ChatResponse(AiMessage("Hello, Ada!"), TokenUsage(30, 6), "stop")
    assert anthropic_server.last.path == "/v1/messages"
    assert anthropic_server.last.body == {
        "model": MODEL,
        "max_tokens": DEFAULT_MAX_TOKENS,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi, I am Ada"}],
    }
    assert _sent_key(anthropic_server) == ANTHROPIC_KEY


def test_history_maps_to_alternating_turns_with_merged_tool_results(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text("Warm in both.")
    history = [
        UserMessage("Weather in Paris and Rome?"),
        AiMessage(
            "Checking.",
            [
                ToolExecutionRequest("toolu_1", "get_weather", '{"city": "Paris"}'),
                ToolExecutionRequest("toolu_2", "get_weather", '{"city": "Rome"}'),
            ],
        ),
        ToolExecutionResultMessage("toolu_1", "get_weather", "21C"),
        ToolExecutionResultMessage("toolu_2", "get_weather", "25C"),
        UserMessage("And be quick."),
        AiMessage(None, [ToolExecutionRequest("toolu_3", "get_weather", "")]),
        ToolExecutionResultMessage("toolu_3", "get_weather", "9C"),
        AiMessage("Partly"),
        AiMessage("cloudy."),
        SystemMessage("You know the weather."),
    ]

    anthropic_model().chat(ChatRequest(history, tools=[WEATHER]))

    body = anthropic_server.last.body
    assert body["system"] == "You know the weather."
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "25C"},
                {"type": "text", "text": "And be quick."},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_3", "name": "get_weather", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "9C"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Partly"}, {"type": "text", "text": "cloudy."}],
        },
    ]
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": dict(WEATHER.parameters),
        }
    ]
    assert "tool_choice" not in body


def test_replayed_malformed_tool_arguments_still_send(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text("ok")
    history = [
        UserMessage("go"),
        AiMessage(None, [ToolExecutionRequest("t1", "f", "{not json")]),
        ToolExecutionResultMessage("t1", "f", "error: bad arguments"),
    ]

    anthropic_model().chat(ChatRequest(history))

    block = anthropic_server.last.body["messages"][1]["content"][0]
    assert block["input"] == {"arguments": "{not json"}


def test_two_parallel_tool_uses_are_parsed(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_message(
        [
            text("Let me check."),
            tool_use("toolu_a", "get_weather", {"city": "Paris"}),
            tool_use("toolu_b", "get_weather", {"city": "Rome"}),
        ],
        stop_reason="tool_use",
    )

    response = anthropic_model().chat(ask(tools=[WEATHER]))

    assert response.ai_message == AiMessage(
        "Let me check.",
        [
            ToolExecutionRequest("toolu_a", "get_weather", '{"city": "Paris"}'),
            ToolExecutionRequest("toolu_b", "get_weather", '{"city": "Rome"}'),
        ],
    )
    assert response.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("wire", "normalised"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_stop_reasons_are_normalised(
    anthropic_server: AnthropicServer, anthropic_model: Make, wire: str, normalised: str
) -> None:
    anthropic_server.reply_text("x", stop_reason=wire)

    assert anthropic_model().chat(ask()).finish_reason == normalised


def test_cached_prompt_tokens_count_as_input(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text(
        "x",
        usage={
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 1000,
        },
    )

    assert anthropic_model().chat(ask()).token_usage == TokenUsage(1110, 5)


def test_a_stream_where_a_message_was_due_is_a_clear_error(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_stream([text("x")])

    with pytest.raises(ValueError, match="did not answer with a message"):
        anthropic_model().chat(ask())


def test_an_error_object_in_a_successful_answer_is_raised_in_the_servers_words(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    # As a gateway answers when the model behind it failed after the answer had begun.
    anthropic_server.queue(
        Reply(
            body={
                "type": "error",
                "error": {"type": "overloaded_error", "message": "upstream model overloaded"},
            }
        )
    )

    with pytest.raises(ValueError, match=r"\(overloaded_error\): upstream model overloaded"):
        anthropic_model().chat(ask())


async def test_a_message_without_content_is_a_clear_error(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    body = message([text("x")])
    body["content"] = None
    anthropic_server.queue(Reply(body=body))

    async with anthropic_model() as model:
        with pytest.raises(ValueError, match="a message without its content"):
            await model.achat(ask())


# -- typed answers -------------------------------------------------------------------------


def test_typed_answer_goes_through_a_forced_tool(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_message(
        [tool_use("toolu_v", "Verdict", {"sentiment": "positive", "score": 0.9})],
        stop_reason="tool_use",
    )

    response = anthropic_model().chat(ask(response_format=VERDICT))

    body = anthropic_server.last.body
    assert body["tool_choice"] == {"type": "tool", "name": "Verdict"}
    assert body["tools"] == [
        {
            "name": "Verdict",
            "description": "Give your final answer by calling this tool; its input is the answer.",
            "input_schema": VERDICT_SCHEMA,
        }
    ]
    assert json.loads(response.ai_message.text or "") == {"sentiment": "positive", "score": 0.9}
    assert response.ai_message.tool_execution_requests == []
    assert response.finish_reason == "stop"


def test_typed_answer_with_tools_lets_the_model_call_them_first(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_message(
        [tool_use("toolu_w", "get_weather", {"city": "Oslo"})], stop_reason="tool_use"
    )
    # A tool named like the answer tool must not be shadowed by it.
    clash = ToolSpecification("Verdict", "A real tool.", {"type": "object", "properties": {}})

    response = anthropic_model().chat(ask(tools=[WEATHER, clash], response_format=VERDICT))

    body = anthropic_server.last.body
    assert body["tool_choice"] == {"type": "any"}
    assert [t["name"] for t in body["tools"]] == ["get_weather", "Verdict", "Verdict_2"]
    assert response.ai_message.tool_execution_requests == [
        ToolExecutionRequest("toolu_w", "get_weather", '{"city": "Oslo"}')
    ]
    assert response.finish_reason == "tool_calls"


def test_native_structured_output_for_strict_schemas(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text('{"sentiment":"negative","score":0.1}')
    anthropic_server.reply_message(
        [tool_use("toolu_d", "counts", {"a": 1})], stop_reason="tool_use"
    )
    model = anthropic_model(structured_output="native")
    loose = ResponseFormat(
        "counts", {"type": "object", "additionalProperties": {"type": "integer"}}
    )

    strict_answer = model.chat(ask(response_format=VERDICT))
    loose_answer = model.chat(ask(response_format=loose))

    strict_body, loose_body = anthropic_server.bodies
    assert strict_body["output_config"] == {
        "format": {"type": "json_schema", "schema": VERDICT_SCHEMA}
    }
    assert "tools" not in strict_body
    assert strict_answer.ai_message.text == '{"sentiment":"negative","score":0.1}'
    # Schemas outside the strict rules fall back to the forced tool.
    assert "output_config" not in loose_body
    assert loose_body["tool_choice"] == {"type": "tool", "name": "counts"}
    assert loose_answer.ai_message.text == '{"a": 1}'


def test_structured_output_off_sends_neither(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text("{}")

    anthropic_model(structured_output="off").chat(ask(response_format=VERDICT))

    assert not {"tools", "tool_choice", "output_config"} & set(anthropic_server.last.body)


# -- parameters ----------------------------------------------------------------------------


def test_request_parameters_override_model_defaults(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_text("a")
    anthropic_server.reply_text("b")
    model = anthropic_model(
        max_tokens=300, temperature=0.5, top_p=0.9, top_k=20, extra={"metadata": {"user_id": "u"}}
    )

    model.chat(ask())
    model.chat(
        ask(
            parameters=ChatRequestParameters(
                temperature=0.1,
                top_p=0.5,
                max_output_tokens=50,
                stop_sequences=["END"],
                extra={"top_k": 5, "service_tier": "auto"},
            )
        )
    )

    first, second = anthropic_server.bodies
    assert {k: first[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "metadata")} == {
        "max_tokens": 300,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "metadata": {"user_id": "u"},
    }
    assert {
        k: second[k]
        for k in ("max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "service_tier")
    } == {
        "max_tokens": 50,
        "temperature": 0.1,
        "top_p": 0.5,
        "top_k": 5,
        "stop_sequences": ["END"],
        "service_tier": "auto",
    }


# -- streaming -----------------------------------------------------------------------------


def test_stream_yields_text_deltas_then_the_whole_response(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_stream([text("Hello there!")], input_tokens=14, output_tokens=4)

    deltas, final = split_stream(list(anthropic_model().stream(ask())))

    assert "".join(deltas) == "Hello there!"
    assert len(deltas) == 3
    assert final == ChatResponse(AiMessage("Hello there!"), TokenUsage(14, 4), "stop")
    assert anthropic_server.last.body["stream"] is True


def test_stream_assembles_two_parallel_tool_uses_from_input_json_deltas(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_stream(
        [
            text("Checking."),
            tool_use("toolu_a", "get_weather", {"city": "Paris"}),
            tool_use("toolu_b", "get_weather", {"city": "Rome"}),
        ],
        split=4,
    )

    deltas, final = split_stream(list(anthropic_model().stream(ask(tools=[WEATHER]))))

    assert "".join(deltas) == "Checking."
    assert final.ai_message.text == "Checking."
    assert [
        (r.id, r.name, json.loads(r.arguments)) for r in final.ai_message.tool_execution_requests
    ] == [
        ("toolu_a", "get_weather", {"city": "Paris"}),
        ("toolu_b", "get_weather", {"city": "Rome"}),
    ]
    assert final.finish_reason == "tool_calls"


def test_stream_of_a_typed_answer_yields_the_answer_json(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_stream([tool_use("toolu_v", "Verdict", {"sentiment": "ok", "score": 1})])

    deltas, final = split_stream(list(anthropic_model().stream(ask(response_format=VERDICT))))

    assert "".join(deltas) == final.ai_message.text
    assert json.loads(final.ai_message.text or "") == {"sentiment": "ok", "score": 1}
    assert final.ai_message.tool_execution_requests == []
    assert final.finish_reason == "stop"


def test_a_stream_left_early_releases_its_connection(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_stream([text("one two three four")])
    anthropic_server.reply_text("next")
    model = anthropic_model()

    stream = model.stream(ask())
    assert isinstance(next(stream), str)
    stream.close()

    assert model.chat(ask()).ai_message.text == "next"


async def test_achat_and_astream(anthropic_server: AnthropicServer, anthropic_model: Make) -> None:
    anthropic_server.reply_message(
        [
            tool_use("toolu_a", "get_weather", {"city": "A"}),
            tool_use("toolu_b", "get_weather", {"city": "B"}),
        ],
        stop_reason="tool_use",
    )
    anthropic_server.reply_stream(
        [text("Cold."), tool_use("toolu_c", "get_weather", {"city": "C"})], output_tokens=9
    )

    async with anthropic_model() as model:
        first = await model.achat(ask(tools=[WEATHER]))
        items = [item async for item in model.astream(ask(tools=[WEATHER]))]

    assert [r.id for r in first.ai_message.tool_execution_requests] == ["toolu_a", "toolu_b"]
    deltas, final = split_stream(items)
    assert "".join(deltas) == "Cold."
    assert final.ai_message.tool_execution_requests == [
        ToolExecutionRequest("toolu_c", "get_weather", '{"city": "C"}')
    ]
    assert final.token_usage == TokenUsage(25, 9)


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind", "error"),
    [
        (401, "authentication_error", anthropic.AuthenticationError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
    ],
)
def test_provider_errors_propagate_as_sdk_types(
    anthropic_server: AnthropicServer,
    anthropic_model: Make,
    status: int,
    kind: str,
    error: type[Exception],
) -> None:
    anthropic_server.reply_error(status, kind, f"failed with {status}")

    with pytest.raises(error) as caught:
        anthropic_model().chat(ask())

    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert len(anthropic_server.requests) == 1
    assert ANTHROPIC_KEY not in str(caught.value)
    assert ANTHROPIC_KEY not in repr(caught.value)


def test_stream_usage_keeps_the_cached_tokens_message_start_gave(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    # message_delta restates the uncached count and may leave the cache fields out.
    from _anthropic_server import stream_events

    events = list(stream_events([text("Hi")], stop_reason="end_turn", output_tokens=4))
    start = events[0][1]["message"]["usage"]
    start.update(cache_read_input_tokens=100, cache_creation_input_tokens=5, input_tokens=10)
    kind, delta = events[-2]
    assert kind == "message_delta"
    delta["usage"] = {"input_tokens": 10, "output_tokens": 4}
    anthropic_server.queue(Reply(events=tuple(events)))

    _, final = split_stream(list(anthropic_model().stream(ask())))

    assert final.token_usage == TokenUsage(115, 4)


def test_httpx_objects_for_an_sdk_built_on_httpx2_fail_when_the_model_is_made() -> None:
    import httpx

    if anthropic.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0] != "httpx2":
        pytest.skip("this anthropic SDK is built on httpx")
    with pytest.raises(TypeError, match=r"http_client is an httpx.Client.*pass an httpx2.Client"):
        AnthropicChatModel(MODEL, api_key="k", http_client=httpx.Client())
    with pytest.raises(TypeError, match=r"timeout is an httpx.Timeout"):
        AnthropicChatModel(MODEL, api_key="k", timeout=httpx.Timeout(5))


def test_an_error_event_mid_stream_raises(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.queue(
        Reply(
            events=(
                ("ping", {"type": "ping"}),
                (
                    "error",
                    {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
                ),
            )
        )
    )

    with pytest.raises(anthropic.APIStatusError, match="overloaded"):
        list(anthropic_model().stream(ask()))


async def test_async_errors_propagate_as_sdk_types(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_error(429, "rate_limit_error", "slow down")
    anthropic_server.reply_error(401, "authentication_error", "bad key")

    async with anthropic_model() as model:
        with pytest.raises(anthropic.RateLimitError):
            await model.achat(ask())
        with pytest.raises(anthropic.AuthenticationError):
            [item async for item in model.astream(ask())]


def test_max_retries_and_timeout_are_the_sdks(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    anthropic_server.reply_error(500, "api_error", "boom", headers={"retry-after-ms": "1"})
    anthropic_server.reply_text("recovered")
    anthropic_server.queue(Reply(body={}, delay=1.0))

    assert anthropic_model(max_retries=1).chat(ask()).ai_message.text == "recovered"
    assert len(anthropic_server.requests) == 2
    with pytest.raises(anthropic.APITimeoutError):
        anthropic_model(timeout=0.1).chat(ask())


# -- keys and configuration ----------------------------------------------------------------


def test_the_key_appears_in_no_repr() -> None:
    model = AnthropicChatModel(MODEL, api_key=ANTHROPIC_KEY, base_url="http://127.0.0.1:1")

    assert ANTHROPIC_KEY not in repr(model)
    assert ANTHROPIC_KEY not in repr(vars(model))
    assert repr(model) == f"AnthropicChatModel(model='{MODEL}', base_url='http://127.0.0.1:1')"


def test_key_comes_from_the_environment(
    anthropic_server: AnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    anthropic_server.reply_text("x")

    with AnthropicChatModel(MODEL, base_url=anthropic_server.origin) as model:
        model.chat(ask())

    assert _sent_key(anthropic_server) == "sk-ant-from-env"


async def test_handed_in_client_is_used_left_open_and_followed_by_the_async_path(
    anthropic_server: AnthropicServer,
) -> None:
    anthropic_server.reply_text("sync")
    anthropic_server.reply_text("async")
    client = anthropic.Anthropic(
        api_key="sk-ant-handed-in", base_url=anthropic_server.origin, max_retries=0
    )
    try:
        async with AnthropicChatModel(MODEL, client=client) as model:
            assert model.chat(ask()).ai_message.text == "sync"
            assert (await model.achat(ask())).ai_message.text == "async"
        assert not client.is_closed()
    finally:
        client.close()

    assert [_sent_key_of(r.headers) for r in anthropic_server.requests] == [
        "sk-ant-handed-in",
        "sk-ant-handed-in",
    ]


async def test_a_handed_in_clients_query_is_kept_by_the_client_made_beside_it(
    anthropic_server: AnthropicServer,
) -> None:
    anthropic_server.reply_text("async")
    client = anthropic.Anthropic(
        api_key="k", base_url=anthropic_server.origin, default_query={"tenant": "t1"}
    )
    try:
        async with AnthropicChatModel(MODEL, client=client) as model:
            await model.achat(ask())
    finally:
        client.close()
    assert anthropic_server.last.path == "/v1/messages?tenant=t1"


async def test_a_handed_in_client_with_a_bearer_token_is_followed_by_the_async_path(
    anthropic_server: AnthropicServer,
) -> None:
    # A gateway that takes a bearer token instead of an API key, and a header of its own.
    anthropic_server.reply_text("sync")
    anthropic_server.reply_text("async")
    client = anthropic.Anthropic(
        auth_token="gateway-token",
        base_url=anthropic_server.origin,
        max_retries=0,
        default_headers={"X-Tenant": "acme"},
    )
    try:
        async with AnthropicChatModel(MODEL, client=client) as model:
            assert model.chat(ask()).ai_message.text == "sync"
            assert (await model.achat(ask())).ai_message.text == "async"
    finally:
        client.close()
    for sent in anthropic_server.requests:
        assert sent.headers["authorization"] == "Bearer gateway-token"
        assert sent.headers["x-tenant"] == "acme"


async def test_a_handed_in_async_client_alone_is_followed_by_the_sync_path(
    anthropic_server: AnthropicServer,
) -> None:
    anthropic_server.reply_text("sync")
    async with anthropic.AsyncAnthropic(
        api_key="sk-ant-gateway", base_url=anthropic_server.origin, max_retries=0
    ) as async_client:
        with AnthropicChatModel(MODEL, async_client=async_client) as model:
            assert anthropic_server.origin in repr(model)
            assert model.chat(ask()).ai_message.text == "sync"
    assert _sent_key(anthropic_server) == "sk-ant-gateway"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": " "}, "model must be a non-empty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"structured_output": "json"}, "structured_output"),
    ],
)
def test_bad_options_are_clear_errors(options: dict[str, Any], message: str) -> None:
    model = options.pop("model", MODEL)
    with pytest.raises(ValueError, match=message) as caught:
        AnthropicChatModel(model, api_key=ANTHROPIC_KEY, **options)
    assert ANTHROPIC_KEY not in str(caught.value)


# -- token counting ------------------------------------------------------------------------


def test_offline_estimate_is_roughly_english_sized() -> None:
    estimator = AnthropicTokenCountEstimator()
    sentence = "The quick brown fox jumps over the lazy dog, again and again."

    count = estimator.estimate_token_count_in_text(sentence)

    assert 10 <= count <= 25  # about 3 to 6 characters a token
    assert estimator.estimate_token_count_in_text("") == 0
    assert estimator.estimate_token_count_in_text(sentence * 10) == 10 * count
    assert estimator.estimate_token_count_in_text("你好世界") == 4


def test_offline_estimate_of_messages_counts_framing_and_tool_calls() -> None:
    estimator = AnthropicTokenCountEstimator()
    bare = estimator.estimate_token_count_in_text("Hello there")

    assert estimator.estimate_token_count_in_message(UserMessage("Hello there")) > bare
    with_call = AiMessage("Hello there", [ToolExecutionRequest("t", "get_weather", '{"c": 1}')])
    assert estimator.estimate_token_count_in_message(
        with_call
    ) > estimator.estimate_token_count_in_message(AiMessage("Hello there"))


def test_api_token_count_asks_the_count_tokens_endpoint_once_per_text(
    anthropic_server: AnthropicServer,
) -> None:
    anthropic_server.reply_count(17)
    anthropic_server.reply_count(9)
    client = anthropic.Anthropic(
        api_key=ANTHROPIC_KEY, base_url=anthropic_server.origin, max_retries=0
    )
    try:
        estimator = AnthropicTokenCountEstimator(MODEL, use_api=True, client=client)
        first = estimator.estimate_token_count_in_text("How many tokens is this?")
        again = estimator.estimate_token_count_in_text("How many tokens is this?")
        message = estimator.estimate_token_count_in_message(UserMessage("Short."))
    finally:
        client.close()

    assert (first, again) == (17, 17)
    assert message == 9 + 3
    assert [r.path for r in anthropic_server.requests] == ["/v1/messages/count_tokens"] * 2
    assert anthropic_server.requests[0].body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    }


def test_api_token_count_makes_its_own_client_and_hides_the_key(
    anthropic_server: AnthropicServer,
) -> None:
    anthropic_server.reply_count(5)
    estimator = AnthropicTokenCountEstimator(
        MODEL, use_api=True, api_key=ANTHROPIC_KEY, base_url=anthropic_server.origin
    )
    try:
        assert estimator.estimate_token_count_in_text("hi") == 5
    finally:
        estimator.close()

    assert _sent_key(anthropic_server) == ANTHROPIC_KEY
    assert ANTHROPIC_KEY not in repr(estimator)
    assert ANTHROPIC_KEY not in repr(vars(estimator))


def test_api_token_count_needs_a_model() -> None:
    with pytest.raises(ValueError, match="needs the model"):
        AnthropicTokenCountEstimator(use_api=True)


def test_native_structured_output_moves_refused_keywords_into_descriptions(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    from pydantic import BaseModel, Field

    from aiservices._output import plan_output

    class Person(BaseModel):
        name: str = Field(pattern="^[A-Z]")
        age: int = Field(ge=0, le=150)
        tags: list[str] = Field(min_length=2)

    fmt = plan_output(Person).response_format
    assert fmt is not None
    anthropic_server.reply_text('{"name": "Ada", "age": 36, "tags": ["a", "b"]}')
    anthropic_model(structured_output="native").chat(ask(response_format=fmt))
    sent = anthropic_server.last.body["output_config"]["format"]["schema"]
    refused = {"minimum", "maximum", "pattern", "minItems"}

    def keywords(node: Any) -> set[str]:
        if isinstance(node, dict):
            return set(node).union(*map(keywords, node.values()))
        if isinstance(node, list):
            return set().union(*map(keywords, node))
        return set()

    assert not keywords(sent) & refused
    assert "minimum: 0" in json.dumps(sent)  # the model still reads the limits


def test_a_tool_result_without_output_is_sent_as_saying_so(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    # The API refuses a blank tool result; the memory keeps what the tool returned.
    anthropic_server.reply_text("Saved.")
    history = [
        UserMessage("Save it"),
        AiMessage(
            tool_execution_requests=[
                ToolExecutionRequest("toolu_1", "save", "{}"),
                ToolExecutionRequest("toolu_2", "log", "{}"),
                ToolExecutionRequest("toolu_3", "echo", "{}"),
            ]
        ),
        ToolExecutionResultMessage("toolu_1", "save", ""),
        ToolExecutionResultMessage("toolu_2", "log", " ", is_error=True),
        ToolExecutionResultMessage("toolu_3", "echo", "done"),
    ]
    anthropic_model().chat(ChatRequest(history))
    blocks = anthropic_server.bodies[0]["messages"][-1]["content"]
    assert [b["content"] for b in blocks] == [
        "(the tool returned no output)",
        "(the tool failed without a message)",
        "done",
    ]
    assert [b.get("is_error") for b in blocks] == [None, True, None]


def test_tool_blocks_in_a_request_that_offers_no_tools_come_with_their_tools_declared(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    # The API refuses tool_use and tool_result blocks in a request without tools: a tool
    # provider that offered them for an earlier call only must not break the conversation.
    anthropic_server.reply_text("You're welcome.")
    anthropic_server.reply_text("Sunny.")
    history = [
        UserMessage("Refund 42"),
        AiMessage(tool_execution_requests=[ToolExecutionRequest("toolu_1", "refund", "{}")]),
        ToolExecutionResultMessage("toolu_1", "refund", "refunded"),
        AiMessage("Refunded."),
        UserMessage("Thanks"),
    ]
    anthropic_model().chat(ChatRequest(history))
    body = anthropic_server.bodies[0]
    assert [t["name"] for t in body["tools"]] == ["refund"]
    assert body["tools"][0]["input_schema"] == {"type": "object"}
    assert body["tool_choice"] == {"type": "none"}
    # With tools offered, they are sent as they are.
    anthropic_model().chat(ChatRequest(history, tools=[WEATHER]))
    assert [t["name"] for t in anthropic_server.bodies[1]["tools"]] == ["get_weather"]
    assert "tool_choice" not in anthropic_server.bodies[1]
    # Tools given through extra= (a server tool) define tools too, and stay usable.
    search = {"type": "web_search_20250305", "name": "web_search"}
    anthropic_server.reply_text("Found it.")
    anthropic_model(extra={"tools": [search]}).chat(ChatRequest(history))
    assert anthropic_server.bodies[2]["tools"] == [search]
    assert "tool_choice" not in anthropic_server.bodies[2]


def test_a_failed_tool_result_is_marked_as_an_error(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    from typing import Protocol

    from aiservices import MessageWindowChatMemory, ai_service, tool
    from aiservices.messages import messages_from_json, messages_to_json

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        raise RuntimeError("no station")

    class Bot(Protocol):
        def ask(self, text: str) -> str: ...

    anthropic_server.reply_message(
        [tool_use("toolu_1", "get_weather", {"city": "Oslo"})], stop_reason="tool_use"
    )
    anthropic_server.reply_text("Sorry, no weather.")
    memory = MessageWindowChatMemory(10)
    bot = ai_service(Bot, model=anthropic_model(), tools=[get_weather], chat_memory=memory)
    assert bot.ask("Weather?") == "Sorry, no weather."
    (result_block,) = anthropic_server.bodies[1]["messages"][-1]["content"]
    assert result_block["type"] == "tool_result"
    assert result_block["is_error"] is True
    recorded = memory.messages()[2]
    assert recorded.is_error is True  # type: ignore[union-attr]
    assert messages_from_json(messages_to_json([recorded]))[0].is_error is True  # type: ignore[union-attr]
    # A result that did not fail carries no mark, in JSON as on the wire.
    ok = ToolExecutionResultMessage("t", "get_weather", "sunny")
    assert "is_error" not in messages_to_json([ok])


def test_no_key_anywhere_is_a_clear_error_when_the_model_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"no Anthropic API key: pass api_key=\.\.\. or set"):
        AnthropicChatModel(MODEL)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    assert AnthropicChatModel(MODEL).model_name == MODEL


def test_a_base_url_server_without_a_key_is_sent_a_placeholder(
    anthropic_server: AnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A gateway or local server that needs no key: the SDK sends nothing without one.
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    anthropic_server.reply_text("hi")
    anthropic_server.reply_text("hi again")
    with AnthropicChatModel(MODEL, base_url=anthropic_server.origin, max_retries=0) as model:
        assert model.chat(ask()).ai_message.text == "hi"
    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.origin)
    with AnthropicChatModel(MODEL, max_retries=0) as model:
        assert model.chat(ask()).ai_message.text == "hi again"
    assert [_sent_key_of(r.headers) for r in anthropic_server.requests] == ["not-needed"] * 2


def test_native_structured_output_keeps_the_other_output_config_settings(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    for _ in range(2):
        anthropic_server.reply_text('{"sentiment":"negative","score":0.1}')
    model = anthropic_model(structured_output="native", extra={"output_config": {"effort": "low"}})
    model.chat(ask(response_format=VERDICT))
    on_request = ChatRequestParameters(extra={"output_config": {"effort": "high"}})
    model.chat(ask(response_format=VERDICT, parameters=on_request))
    on_model, on_call = anthropic_server.bodies
    schema = {"type": "json_schema", "schema": VERDICT_SCHEMA}
    assert on_model["output_config"] == {"effort": "low", "format": schema}
    assert on_call["output_config"] == {"effort": "high", "format": schema}


def test_blank_text_is_never_sent_as_a_block_the_api_refuses(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    # A model may answer "\n\n" beside a tool call; replayed from memory, that block would
    # make every later request of the conversation fail.
    anthropic_server.reply_text("ok")
    call = ToolExecutionRequest("toolu_1", "get_weather", '{"city": "Oslo"}')
    anthropic_model().chat(
        ChatRequest(
            [
                UserMessage("Weather?"),
                AiMessage("\n\n", tool_execution_requests=[call]),
                ToolExecutionResultMessage("toolu_1", "get_weather", "sunny"),
                UserMessage("  "),
                AiMessage(" "),
                UserMessage("Thanks"),
            ]
        )
    )
    sent = anthropic_server.bodies[0]["messages"]
    texts = [
        block["text"]
        for turn in sent
        for block in (turn["content"] if isinstance(turn["content"], list) else [])
        if block["type"] == "text"
    ] + [turn["content"] for turn in sent if isinstance(turn["content"], str)]
    assert all(text.strip() for text in texts), sent
    assert [turn["role"] for turn in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][0]["type"] == "tool_use"
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text"]


def test_a_blank_user_message_alone_is_a_clear_error_before_the_request(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    with pytest.raises(ValueError, match="refuses a user message that is empty"):
        anthropic_model().chat(ask(" \n"))
    assert anthropic_server.bodies == []


async def test_a_max_tokens_the_sdk_sends_only_as_a_stream_is_streamed_by_chat(
    anthropic_server: AnthropicServer, anthropic_model: Make
) -> None:
    # The SDK refuses a plain call whose max_tokens may take over 10 minutes: chat() and
    # achat() stream it, and give the whole answer.
    anthropic_server.reply_stream([text("Hello there!")], input_tokens=14, output_tokens=4)
    anthropic_server.reply_stream([text("Again.")], input_tokens=3, output_tokens=2)
    model = anthropic_model(max_tokens=32_000)
    answer = model.chat(ask())
    again = await model.achat(ask())
    await model.aclose()
    assert answer.ai_message.text == "Hello there!"
    assert answer.token_usage is not None
    assert answer.token_usage.output_tokens == 4
    assert again.ai_message.text == "Again."
    assert [body["stream"] for body in anthropic_server.bodies] == [True, True]
    assert anthropic_server.bodies[0]["max_tokens"] == 32_000
