"""Typed returns through a service: the schema sent, parsing, retries and OutputParseError."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Protocol

import pytest
from pydantic import BaseModel

from aiservices import (
    MemoryId,
    MessageWindowChatMemory,
    OutputParseError,
    Result,
    UserMessage,
    ai_service,
    user_message,
)
from aiservices.testing import ScriptedChatModel


class Sentiment(Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"


class Verdict(BaseModel):
    sentiment: Sentiment
    score: float


class Classifier(Protocol):
    @user_message("Classify the sentiment of: {{text}}")
    def classify(self, text: str) -> Verdict: ...

    @user_message("Sentiment of: {{text}}")
    def sentiment(self, text: str) -> Sentiment: ...

    @user_message("Numbers in: {{text}}")
    def numbers(self, text: str) -> list[int]: ...

    @user_message("Is it true: {{text}}")
    def check(self, text: str) -> Result[bool]: ...


def test_typed_return_sends_the_schema_and_parses_the_answer() -> None:
    model = ScriptedChatModel('{"sentiment": "positive", "score": 0.9}')
    bot = ai_service(Classifier, model=model)
    assert bot.classify("great") == Verdict(sentiment=Sentiment.POSITIVE, score=0.9)
    response_format = model.last_request.response_format
    assert response_format is not None
    assert set(response_format.schema["properties"]) == {"sentiment", "score"}


def test_non_object_types_are_wrapped_and_lenient_forms_accepted() -> None:
    model = ScriptedChatModel("POSITIVE", '```json\n{"value": [1, 2, 3]}\n```', "true")
    bot = ai_service(Classifier, model=model)
    assert bot.sentiment("x") is Sentiment.POSITIVE
    assert bot.numbers("1 2 3") == [1, 2, 3]
    assert model.last_request.response_format is not None
    assert model.last_request.response_format.schema["required"] == ["value"]
    assert bot.check("x").content is True


def test_a_bad_answer_is_retried_with_the_error_and_only_the_good_one_is_recorded() -> None:
    class Bot(Protocol):
        def classify(self, user: Annotated[str, MemoryId], text: str) -> Verdict: ...

    model = ScriptedChatModel("not json at all", '{"sentiment": "negative", "score": 0.1}')
    memory = MessageWindowChatMemory.provider(max_messages=10)
    bot = ai_service(Bot, model=model, chat_memory_provider=memory)
    assert bot.classify("u", "awful").sentiment is Sentiment.NEGATIVE
    retry = model.requests[1].messages
    assert retry[-2].text == "not json at all"
    assert isinstance(retry[-1], UserMessage)
    assert "Answer again with JSON" in retry[-1].text
    recorded = memory("u").messages()
    assert [m.text for m in recorded] == ["awful", '{"sentiment": "negative", "score": 0.1}']


def test_output_parse_error_after_the_retries_keeps_the_raw_text_and_memory() -> None:
    class Bot(Protocol):
        def classify(self, user: Annotated[str, MemoryId], text: str) -> Verdict: ...

    model = ScriptedChatModel("nope", "still nope", "never")
    memory = MessageWindowChatMemory.provider(max_messages=10)
    bot = ai_service(Bot, model=model, chat_memory_provider=memory, max_output_retries=2)
    with pytest.raises(OutputParseError) as info:
        bot.classify("u", "x")
    assert info.value.raw_text == "never"
    assert info.value.attempts == 3
    assert isinstance(info.value, ValueError)
    assert memory("u").messages() == []


def test_zero_retries_fails_on_the_first_bad_answer() -> None:
    model = ScriptedChatModel("nope", "42")
    bot = ai_service(Classifier, model=model, max_output_retries=0)
    with pytest.raises(OutputParseError) as failed:
        bot.numbers("x")
    assert len(model.requests) == 1
    # The declared type as written, not its bare origin ("list").
    assert "could not be parsed as list[int] after 1 attempt(s)" in str(failed.value)


def test_the_retry_message_carries_the_schema() -> None:
    model = ScriptedChatModel("no json here", '{"sentiment": "positive", "score": 1}')
    bot = ai_service(Classifier, model=model)
    bot.classify("x")
    feedback = model.requests[1].messages[-1].text
    assert '"sentiment"' in feedback
    assert "JSON schema" in feedback


def test_the_library_errors_survive_pickling() -> None:
    import pickle

    from aiservices import GuardrailError, InterfaceError, OutputParseError, ToolLimitError

    for error in (
        OutputParseError("bad answer", raw_text="x", attempts=2),
        ToolLimitError("too many", limit=3),
        InterfaceError(["a", "b"]),
        GuardrailError("no", message="refused"),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error)
        assert str(again) == str(error)
        assert vars(again) == vars(error)
