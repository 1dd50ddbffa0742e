"""Answers that cannot be whole: a stream that ends without its final event is an error and
records nothing; a refusal or an answer cut at the token limit is not asked again. Also:
tool-only assistant turns are sent with "" content; Azure gets max_completion_tokens. A
stream whose connection fails midway raises the SDK's own connection or timeout error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, Protocol

import anthropic
import openai
import pytest
from _anthropic_server import AnthropicServer, stream_events, text
from _loopback import LoopbackServer, Reply
from _openai_server import OpenAIServer, chunks
from pydantic import BaseModel

from aiservices import (
    ChatMemoryAccess,
    IncompleteResponseError,
    MemoryId,
    MessageWindowChatMemory,
    OutputParseError,
    ai_service,
)
from aiservices.messages import UserMessage
from aiservices.models import ChatRequest
from aiservices.models.openai import OpenAIChatModel


class Bot(ChatMemoryAccess, Protocol):
    def stream(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

    def astream(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[str]: ...


def _bot(model: Any) -> Bot:
    return ai_service(
        Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10)
    )


def _drain_async(stream: AsyncIterator[str], model: Any) -> list[str]:
    async def drain() -> list[str]:
        try:
            return [piece async for piece in stream]
        finally:
            await model.aclose()  # the async client's sockets belong to this loop

    return asyncio.run(drain())


def _consume(bot: Bot, model: Any, mode: str) -> list[str]:
    if mode == "sync":
        return list(bot.stream("u", "the answer?"))
    return _drain_async(bot.astream("u", "the answer?"), model)


def _cut(server: OpenAIServer, *, keep: int) -> None:
    bodies = chunks(["The answer ", "is ", "42."], finish_reason="stop")
    # The chunks before the one carrying finish_reason, as a stream cut there delivers them.
    server.reply_raw_stream(
        [b for b in bodies if b["choices"] and not b["choices"][0]["finish_reason"]][:keep]
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_openai_stream_cut_before_its_finish_reason_records_nothing(
    openai_server: OpenAIServer, openai_model: Callable[..., Any], mode: str
) -> None:
    model = openai_model()
    bot = _bot(model)
    _cut(openai_server, keep=2)
    with pytest.raises(IncompleteResponseError, match="without a finish_reason"):
        _consume(bot, model, mode)
    assert bot.get_chat_memory("u").messages() == []


def test_a_plain_body_answered_to_a_stream_request_is_incomplete(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    bot = _bot(openai_model())
    openai_server.reply_text("a whole answer, but not a stream")
    with pytest.raises(IncompleteResponseError):
        list(bot.stream("u", "hi"))
    assert bot.get_chat_memory("u").messages() == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_anthropic_stream_without_message_stop_records_nothing(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any], mode: str
) -> None:
    model = anthropic_model()
    bot = _bot(model)
    events = stream_events([text("The answer is 42.")], stop_reason="end_turn")
    anthropic_server.queue(Reply(events=events[:-1]))  # everything but message_stop
    with pytest.raises(IncompleteResponseError, match="without message_stop"):
        _consume(bot, model, mode)
    assert bot.get_chat_memory("u").messages() == []


# A read timeout would take the SDK's default (600 s) without one; a stalled stream never
# resumes, so any timeout fires.
_STALL_TIMEOUT = 1.0


def _fail_midway(server: LoopbackServer, failure: str) -> None:
    # After a few events, text among them: the answer has begun.
    if failure == "dropped":
        server.break_last_stream(after_events=4)
    else:
        server.stall_last_stream(after_events=4)


_FAILURES = [
    pytest.param("dropped", anthropic.APIConnectionError, openai.APIConnectionError, id="dropped"),
    pytest.param("stalled", anthropic.APITimeoutError, openai.APITimeoutError, id="stalled"),
]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("failure", "error", "_"), _FAILURES)
def test_an_anthropic_stream_failing_midway_raises_the_sdks_error_and_records_nothing(
    anthropic_server: AnthropicServer,
    anthropic_model: Callable[..., Any],
    mode: str,
    failure: str,
    error: type[Exception],
    _: object,
) -> None:
    model = anthropic_model(timeout=_STALL_TIMEOUT)
    bot = _bot(model)
    anthropic_server.queue(
        Reply(events=stream_events([text("The answer is 42.")], stop_reason="end_turn"))
    )
    _fail_midway(anthropic_server, failure)
    with pytest.raises(error) as raised:
        _consume(bot, model, mode)
    assert type(raised.value) is error  # a timeout is also a connection error: not the reverse
    assert bot.get_chat_memory("u").messages() == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_anthropic_chat_streaming_a_long_request_raises_the_sdks_error_when_it_fails_midway(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any], mode: str
) -> None:
    # A max_tokens the SDK sends only as a stream (and only with its default timeout, so no
    # stall here): chat() and achat() read a stream too.
    model = anthropic_model(max_tokens=32_000)
    anthropic_server.queue(
        Reply(events=stream_events([text("The answer is 42.")], stop_reason="end_turn"))
    )
    _fail_midway(anthropic_server, "dropped")
    request = ChatRequest([UserMessage("the answer?")])

    async def achat() -> object:
        try:
            return await model.achat(request)
        finally:
            await model.aclose()

    with pytest.raises(anthropic.APIConnectionError) as raised:
        model.chat(request) if mode == "sync" else asyncio.run(achat())
    assert type(raised.value) is anthropic.APIConnectionError
    assert anthropic_server.bodies[0]["stream"] is True


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("failure", "_", "error"), _FAILURES)
def test_an_openai_stream_failing_midway_raises_the_sdks_error_and_records_nothing(
    openai_server: OpenAIServer,
    openai_model: Callable[..., Any],
    mode: str,
    failure: str,
    _: object,
    error: type[Exception],
) -> None:
    model = openai_model(timeout=_STALL_TIMEOUT)
    bot = _bot(model)
    openai_server.reply_stream(["The answer ", "is ", "42."], finish_reason="stop")
    _fail_midway(openai_server, failure)
    with pytest.raises(error) as raised:
        _consume(bot, model, mode)
    assert type(raised.value) is error
    assert bot.get_chat_memory("u").messages() == []


def test_a_whole_stream_still_records_its_turn(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    bot = _bot(openai_model())
    openai_server.reply_stream(["The answer ", "is 42."], finish_reason="stop")
    assert "".join(bot.stream("u", "the answer?")) == "The answer is 42."
    assert [m.text for m in bot.get_chat_memory("u").messages()] == [
        "the answer?",
        "The answer is 42.",
    ]


@pytest.mark.parametrize(
    ("base_url", "key"),
    [
        ("https://my-resource.openai.azure.com/openai/v1", "max_completion_tokens"),
        ("https://my-resource.cognitiveservices.azure.com/openai/v1", "max_completion_tokens"),
        ("http://127.0.0.1:8080/v1", "max_tokens"),
    ],
)
def test_azure_openai_gets_max_completion_tokens(base_url: str, key: str) -> None:
    model = OpenAIChatModel("o3-mini", base_url=base_url, api_key="k", max_tokens=100)
    request = model._request(ChatRequest([]))
    assert request[key] == 100
    assert {"max_tokens", "max_completion_tokens"} - {key} not in [set(request)]
    model.close()


class Person(BaseModel):
    name: str
    age: int


class Typed(Protocol):
    def extract(self, text: str) -> Person: ...


def test_a_refusal_is_not_asked_again(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    openai_server.reply_text(None, refusal="I can't help with that.")
    bot = ai_service(Typed, model=openai_model())
    with pytest.raises(OutputParseError, match="the model refused") as raised:
        bot.extract("someone")
    assert raised.value.raw_text == "I can't help with that."
    assert raised.value.attempts == 1
    assert len(openai_server.requests) == 1  # no pointless second request


def test_an_answer_cut_at_the_token_limit_is_not_asked_again(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    openai_server.reply_text('{"name": "Ada", "a', finish_reason="length")
    bot = ai_service(Typed, model=openai_model())
    with pytest.raises(OutputParseError, match="cut at the output token limit"):
        bot.extract("Ada, 36")
    assert len(openai_server.requests) == 1


_NOT_JSON = "<html>502 Bad Gateway</html>"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_openai_stream_with_an_event_that_is_not_json_shows_it_and_records_nothing(
    openai_server: OpenAIServer, openai_model: Callable[..., Any], mode: str
) -> None:
    model = openai_model()
    bot = _bot(model)
    first, second, *_ = chunks(["Hello ", "world"])
    openai_server.queue(Reply(events=((None, first), (None, second), (None, _NOT_JSON))))
    with pytest.raises(ValueError, match=r"streamed an event that is not JSON: '<html>502"):
        _consume(bot, model, mode)
    assert bot.get_chat_memory("u").messages() == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_anthropic_stream_with_an_event_that_is_not_json_shows_it_and_records_nothing(
    anthropic_server: AnthropicServer, anthropic_model: Callable[..., Any], mode: str
) -> None:
    model = anthropic_model()
    bot = _bot(model)
    events = stream_events([text("Hello world")], stop_reason="end_turn")
    anthropic_server.queue(Reply(events=(*events[:4], ("content_block_delta", _NOT_JSON))))
    with pytest.raises(ValueError, match=r"streamed an event that is not JSON: '<html>502"):
        _consume(bot, model, mode)
    assert bot.get_chat_memory("u").messages() == []


# Some compatible servers (vLLM before 0.6) send an error as the body itself.
_FLAT_ERROR = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens",
    "type": "BadRequestError",
    "code": 400,
}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_error_streamed_in_the_flat_form_is_told_in_the_servers_words(
    openai_server: OpenAIServer, openai_model: Callable[..., Any], mode: str
) -> None:
    model = openai_model()
    bot = _bot(model)
    first, *_ = chunks(["Hello "])
    openai_server.queue(Reply(events=((None, first), (None, _FLAT_ERROR), (None, "[DONE]"))))
    with pytest.raises(ValueError, match=r"\(code 400\): This model's maximum context length"):
        _consume(bot, model, mode)
    assert bot.get_chat_memory("u").messages() == []


def test_an_error_answered_in_the_flat_form_is_told_in_the_servers_words(
    openai_server: OpenAIServer, openai_model: Callable[..., Any]
) -> None:
    model = openai_model()
    openai_server.reply_body(_FLAT_ERROR)
    with pytest.raises(ValueError, match=r"\(code 400\): This model's maximum context length"):
        model.chat(ChatRequest([UserMessage("hi")]))
