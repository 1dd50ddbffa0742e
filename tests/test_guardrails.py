"""Input and output guardrails: pass, rewrite, refuse, reprompt; sync and async; per
service and per method. A refused or reprompted turn leaves the store byte for byte as it
was, on the in-memory and the SQLite store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any, Protocol

import pytest
from _recorded import StoreUnderTest, store_under_test
from pydantic import BaseModel

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    GuardrailError,
    InterfaceError,
    MemoryId,
    MessageWindowChatMemory,
    OutputParseError,
    Reprompt,
    Result,
    UserMessage,
    ai_service,
    guardrails,
)
from aiservices.testing import ScriptedChatModel

__all__ = ["store_under_test"]  # a fixture, used by name


def no_secrets(text: str) -> str | None:
    if "password" in text:
        raise GuardrailError("the message holds a password")
    return None


def redact(text: str) -> str | None:
    return text.replace("4111-1111", "[card]") if "4111-1111" in text else None


def polite(message: AiMessage) -> AiMessage | str | None:
    if message.text and "stupid" in message.text:
        raise Reprompt("Answer politely, without insults.")
    return None


def shout(message: AiMessage) -> str:
    return (message.text or "").upper()


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    @guardrails(output=[shout])
    def loud(self, user: Annotated[str, MemoryId], text: str) -> str: ...


def _bot(model: ScriptedChatModel, found: StoreUnderTest, **options: Any) -> Bot:
    return ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=20, store=found.store),
        **options,
    )


def _texts(bot: Bot) -> list[str | None]:
    return [m.text for m in bot.get_chat_memory("u").messages()]


def test_an_input_refusal_never_calls_the_model_and_records_nothing(
    store_under_test: StoreUnderTest,
) -> None:
    model = ScriptedChatModel("Hello!", "never")
    bot = _bot(model, store_under_test, input_guardrails=[no_secrets])
    bot.chat("u", "hi")
    before = store_under_test.snapshot()
    with pytest.raises(GuardrailError, match="holds a password") as raised:
        bot.chat("u", "my password is hunter2")
    assert raised.value.reason == "the message holds a password"
    assert len(model.requests) == 1
    assert store_under_test.snapshot() == before
    assert _texts(bot) == ["hi", "Hello!"]


def test_an_input_rewrite_is_what_the_model_sees_and_the_memory_keeps(
    store_under_test: StoreUnderTest,
) -> None:
    model = ScriptedChatModel("Noted.")
    bot = _bot(model, store_under_test, input_guardrails=[no_secrets, redact])
    bot.chat("u", "my card is 4111-1111")
    assert model.requests[0].messages == [UserMessage("my card is [card]")]
    assert _texts(bot) == ["my card is [card]", "Noted."]


def test_an_output_rewrite_replaces_the_answer_returned_and_recorded(
    store_under_test: StoreUnderTest,
) -> None:
    bot = _bot(ScriptedChatModel("calm down"), store_under_test)
    assert bot.loud("u", "hey") == "CALM DOWN"
    assert _texts(bot) == ["hey", "CALM DOWN"]


def test_an_output_refusal_raises_and_records_nothing(store_under_test: StoreUnderTest) -> None:
    def refuse(message: AiMessage) -> None:
        raise GuardrailError("off topic")

    model = ScriptedChatModel("Hello!", "about football")
    bot = _bot(model, store_under_test)
    bot.chat("u", "hi")
    before = store_under_test.snapshot()
    refusing = _bot(model, store_under_test, output_guardrails=[refuse])
    with pytest.raises(GuardrailError, match="off topic"):
        refusing.chat("u", "tell me about football")
    assert store_under_test.snapshot() == before


def test_a_reprompt_asks_again_and_records_neither_the_rejected_answer_nor_the_reason(
    store_under_test: StoreUnderTest,
) -> None:
    model = ScriptedChatModel("That is a stupid question.", "Happy to help!")
    bot = _bot(model, store_under_test, output_guardrails=[polite])
    assert bot.chat("u", "help?") == "Happy to help!"
    second = model.requests[1].messages
    assert second == [
        UserMessage("help?"),
        AiMessage("That is a stupid question."),
        UserMessage("Answer politely, without insults."),
    ]
    assert _texts(bot) == ["help?", "Happy to help!"]
    history = store_under_test.store.get_messages("u")
    assert [m.text for m in history] == ["help?", "Happy to help!"]
    assert history[0].turn_id == history[1].turn_id


def test_reprompts_are_bounded_by_max_output_retries(store_under_test: StoreUnderTest) -> None:
    model = ScriptedChatModel("Hello!", default="stupid again")
    bot = _bot(model, store_under_test, output_guardrails=[polite], max_output_retries=2)
    bot.chat("u", "hi")
    before = store_under_test.snapshot()
    with pytest.raises(GuardrailError, match=r"after 2 reprompt\(s\): Answer politely") as raised:
        bot.chat("u", "help?")
    assert isinstance(raised.value.__cause__, Reprompt)
    assert len(model.requests) == 1 + 3  # the first answer and two reprompts
    assert store_under_test.snapshot() == before


def test_the_methods_guardrails_run_after_the_services() -> None:
    seen: list[str] = []

    def service_first(message: AiMessage) -> str:
        seen.append(f"service saw {message.text}")
        return f"{message.text}!"

    class Ordered(Protocol):
        @guardrails(output=[shout])
        def chat(self, text: str) -> str: ...

    bot = ai_service(Ordered, model=ScriptedChatModel("hi"), output_guardrails=[service_first])
    assert bot.chat("x") == "HI!"
    assert seen == ["service saw hi"]


def test_output_guardrails_see_the_answer_before_it_is_parsed() -> None:
    class Verdict(BaseModel):
        score: int

    class Judge(Protocol):
        def judge(self, text: str) -> Verdict: ...

    def fix_json(message: AiMessage) -> str:
        return (message.text or "").replace("'", '"')

    bot = ai_service(Judge, model=ScriptedChatModel("{'score': 3}"), output_guardrails=[fix_json])
    assert bot.judge("x") == Verdict(score=3)


def test_a_guardrail_that_returns_something_else_is_a_type_error_naming_it() -> None:
    def wrong(text: str) -> int:
        return 3

    class Plain(Protocol):
        def chat(self, text: str) -> str: ...

    bot = ai_service(Plain, model=ScriptedChatModel("x"), input_guardrails=[wrong])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"input guardrail .*wrong returned int"):
        bot.chat("hi")


def test_a_reprompt_from_an_input_guardrail_is_a_type_error_naming_it(
    store_under_test: StoreUnderTest,
) -> None:
    # There is no answer to ask again for: the misuse is told, the model is never called
    # and nothing is recorded.
    def ask_again(text: str) -> None:
        raise Reprompt("be nicer")

    model = ScriptedChatModel("never")
    bot = _bot(model, store_under_test, input_guardrails=[ask_again])
    before = store_under_test.snapshot()
    with pytest.raises(TypeError, match=r"input guardrail .*ask_again raised Reprompt") as raised:
        bot.chat("u", "hi")
    assert isinstance(raised.value.__cause__, Reprompt)
    assert model.requests == []
    assert store_under_test.snapshot() == before


class AsyncBot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    async def detailed(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


def test_async_guardrails_are_awaited_in_async_calls(store_under_test: StoreUnderTest) -> None:
    async def slow_redact(text: str) -> str:
        await asyncio.sleep(0)
        return text.replace("secret", "[hidden]")

    async def slow_polite(message: AiMessage) -> None:
        await asyncio.sleep(0)
        if message.text and "stupid" in message.text:
            raise Reprompt("Be nice.")

    model = ScriptedChatModel("stupid", "Fine.")
    bot = ai_service(
        AsyncBot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(
            max_messages=20, store=store_under_test.store
        ),
        input_guardrails=[slow_redact],
        output_guardrails=[slow_polite],
    )
    assert asyncio.run(bot.chat("u", "my secret")) == "Fine."
    assert [m.text for m in bot.get_chat_memory("u").messages()] == ["my [hidden]", "Fine."]
    assert model.requests[1].messages[-1] == UserMessage("Be nice.")


def test_an_async_guardrail_on_a_sync_method_fails_the_build() -> None:
    async def checker(text: str) -> None:
        return None

    class Mixed(Protocol):
        def chat(self, text: str) -> str: ...

        async def achat(self, text: str) -> str: ...

    with pytest.raises(
        InterfaceError, match=r"Mixed.chat\(\): the input guardrail .*checker is async"
    ):
        ai_service(Mixed, model=ScriptedChatModel("x"), input_guardrails=[checker])


def test_output_guardrails_on_a_streaming_method_fail_the_build() -> None:
    class Streaming(Protocol):
        def stream(self, text: str) -> Iterator[str]: ...

    with pytest.raises(InterfaceError, match=r"Streaming.stream\(\): a streaming method shows"):
        ai_service(Streaming, model=ScriptedChatModel("x"), output_guardrails=[shout])
    # Input guardrails are fine on a stream: they run before the model is asked.
    bot = ai_service(Streaming, model=ScriptedChatModel("x"), input_guardrails=[redact])
    assert list(bot.stream("4111-1111")) == ["x"]


def test_guardrails_rejects_what_is_not_callable() -> None:
    with pytest.raises(TypeError, match="takes callables"):
        guardrails(input=["nope"])  # type: ignore[list-item]

    class Plain(Protocol):
        def chat(self, text: str) -> str: ...

    with pytest.raises(InterfaceError, match=r"output_guardrails\[0\]"):
        ai_service(Plain, model=ScriptedChatModel("x"), output_guardrails=[42])  # type: ignore[list-item]


# -- where guardrails are declared ------------------------------------------------------


def _tag(label: str) -> Any:
    def check(message: AiMessage) -> str:
        return f"{message.text}+{label}"

    check.__qualname__ = label
    return check


def test_stacked_decorators_add_up_and_run_in_the_order_written() -> None:
    class Tagged(Protocol):
        @guardrails(output=[_tag("top")])
        @guardrails(input=[redact], output=[_tag("bottom")])
        def chat(self, text: str) -> str: ...

    model = ScriptedChatModel("answer")
    bot = ai_service(Tagged, model=model, output_guardrails=[_tag("service")])
    assert bot.chat("card 4111-1111") == "answer+service+top+bottom"
    assert model.sent_texts() == [("user", "card [card]")]


def test_guardrails_on_the_interface_apply_to_every_method_between_the_service_and_the_method() -> (
    None
):
    @guardrails(input=[no_secrets], output=[_tag("base")])
    class Base(Protocol):
        def ask(self, text: str) -> str: ...

    @guardrails(output=[_tag("interface")])
    class Tagged(Base, Protocol):
        @guardrails(output=[_tag("method")])
        def chat(self, text: str) -> str: ...

    model = ScriptedChatModel(default="answer")
    bot = ai_service(Tagged, model=model, output_guardrails=[_tag("service")])
    assert bot.chat("hi") == "answer+service+base+interface+method"
    assert bot.ask("hi") == "answer+service+base+interface"
    with pytest.raises(GuardrailError):
        bot.ask("my password is 1234")
    assert len(model.requests) == 2  # the refused input never reached the model


def test_output_guardrails_on_an_interface_with_a_streaming_method_fail_the_build() -> None:
    @guardrails(output=[shout])
    class Streams(Protocol):
        def chat(self, text: str) -> str: ...

        def story(self, text: str) -> Iterator[str]: ...

    with pytest.raises(InterfaceError, match=r"Streams\.story\(\).*output guardrails"):
        ai_service(Streams, model=ScriptedChatModel())


def test_a_lone_guardrail_where_a_list_belongs_is_a_clear_error() -> None:
    def check(message: AiMessage) -> None:
        return None

    with pytest.raises(TypeError, match=r"@guardrails\(output=\[check\]\)"):
        guardrails(output=check)  # type: ignore[arg-type]

    with pytest.raises(InterfaceError, match=r"input_guardrails=\[no_secrets\]"):
        ai_service(
            Bot,
            model=ScriptedChatModel(),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
            input_guardrails=no_secrets,  # type: ignore[arg-type]
        )


# -- what a reprompt and a parse retry leave in the turn ------------------------------------


def positive(message: AiMessage) -> None:
    if (message.text or "").strip().startswith("-"):
        raise Reprompt("The number must be positive.")


class Pick(Protocol):
    def pick(self, question: str) -> int: ...


def test_a_parse_retry_after_a_reprompt_still_shows_the_reprompt() -> None:
    model = ScriptedChatModel("-42", "forty-two", "42")
    bot = ai_service(Pick, model=model, output_guardrails=[positive], max_output_retries=2)
    assert bot.pick("Pick a number") == 42
    last = [m.text or "" for m in model.requests[2].messages]
    assert last[:5] == [
        "Pick a number",
        "-42",
        "The number must be positive.",
        "forty-two",
        last[4],
    ]
    assert "not a valid int" in last[4]


def test_a_tool_round_after_a_reprompt_still_shows_the_reprompt() -> None:
    from aiservices import ToolExecutionRequest, tool

    @tool
    def double(n: int) -> int:
        """Double a number."""
        return 2 * n

    call = AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "double", '{"n": 21}')])
    model = ScriptedChatModel("-1", call, "42")
    bot = ai_service(Pick, model=model, tools=[double], output_guardrails=[positive])
    assert bot.pick("Pick a number") == 42
    texts = [m.text for m in model.requests[2].messages]
    assert texts[:3] == ["Pick a number", "-1", "The number must be positive."]
    assert texts[-1] == "42"  # the tool's result


def test_reprompts_out_gives_the_guardrails_own_reason_and_counts_every_answer() -> None:
    model = ScriptedChatModel(default="-1")
    bot = ai_service(Pick, model=model, output_guardrails=[positive], max_output_retries=2)
    with pytest.raises(GuardrailError) as refused:
        bot.pick("Pick a number")
    assert refused.value.reason == "The number must be positive."
    assert "Pick.pick" in str(refused.value)
    assert "2 reprompt(s)" in str(refused.value)

    from aiservices.errors import OutputParseError

    model = ScriptedChatModel("-1", "nope", "still nope")
    bot = ai_service(Pick, model=model, output_guardrails=[positive], max_output_retries=1)
    with pytest.raises(OutputParseError) as failed:
        bot.pick("Pick a number")
    assert len(model.requests) == 3
    assert failed.value.attempts == 3
    assert "after 3 attempt(s)" in str(failed.value)


def test_an_output_guardrail_may_not_answer_with_a_tool_request(
    store_under_test: StoreUnderTest,
) -> None:
    from aiservices import ToolExecutionRequest

    def to_tool(message: AiMessage) -> AiMessage:
        return AiMessage(tool_execution_requests=[ToolExecutionRequest("c1", "x", "{}")])

    bot = _bot(ScriptedChatModel("hi", "hello"), store_under_test)
    bot.chat("u", "first")
    before = store_under_test.snapshot()
    bot = _bot(ScriptedChatModel("hi"), store_under_test, output_guardrails=[to_tool])
    with pytest.raises(TypeError, match="to_tool returned an AiMessage that asks for tools"):
        bot.chat("u", "Hello")
    assert store_under_test.snapshot() == before


def test_a_guardrails_replacement_that_does_not_parse_fails_at_once_naming_it() -> None:
    def censor(message: AiMessage) -> str:
        return "not a number"

    class Counter(Protocol):
        @guardrails(output=[censor])
        def count(self, text: str) -> int: ...

    model = ScriptedChatModel("1", "2")
    bot = ai_service(Counter, model=model)
    with pytest.raises(OutputParseError, match=r"output guardrail .*censor put in place") as caught:
        bot.count("x")
    assert caught.value.raw_text == "not a number"
    assert len(model.requests) == 1  # the model was not asked to correct what it never wrote


@pytest.mark.parametrize("hands_on", ["the message", "its text", "a copy", "changed back"])
def test_a_guardrail_that_hands_the_answer_on_keeps_parse_retries(hands_on: str) -> None:
    # An auditing guardrail returns what it was given: the answer is still the model's, so
    # an answer that does not parse is sent back to be corrected, as without the guardrail.
    seen: list[str] = []

    def audit(message: AiMessage) -> AiMessage | str:
        seen.append(message.text or "")
        if hands_on == "the message":
            return message
        if hands_on == "its text":
            return message.text or ""
        return AiMessage(message.text)

    def rewrite(message: AiMessage) -> str:
        return "something else"

    def restore(message: AiMessage) -> str:
        return seen[-1]  # what the model wrote

    class Counter(Protocol):
        def count(self, text: str) -> int: ...

    model = ScriptedChatModel("about forty-two", "42")
    guards = [audit] if hands_on != "changed back" else [audit, rewrite, restore]
    bot = ai_service(Counter, model=model, output_guardrails=guards, max_output_retries=1)
    assert bot.count("How many?") == 42
    assert len(model.requests) == 2
    assert seen[0] == "about forty-two"
