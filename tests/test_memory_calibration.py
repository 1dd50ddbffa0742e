"""Token windows corrected with the input tokens the provider reported (``calibrate=True``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Sequence
from pathlib import Path
from typing import Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiservices import ai_service
from aiservices.memory import (
    MessageWindowChatMemory,
    SummarizingChatMemory,
    TokenWindowChatMemory,
)
from aiservices.messages import AiMessage, ChatMessage, UserMessage
from aiservices.models import ChatRequest, ChatResponse, TokenUsage
from aiservices.stores import InMemoryChatMemoryStore, SqliteChatMemoryStore
from aiservices.testing import ScriptedChatModel


class Words:
    """One token per word; records how often each message was counted."""

    def __init__(self) -> None:
        self.counted: Counter[str | None] = Counter()

    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        self.counted[message.message_id] += 1
        return len((getattr(message, "text", None) or "").split())


def words(messages: Sequence[ChatMessage]) -> int:
    return sum(len((getattr(m, "text", None) or "").split()) for m in messages)


def provider_counting(ratio: float, overhead: int = 0) -> Callable[[ChatRequest], ChatResponse]:
    """A model whose tokenizer counts ``ratio`` tokens per word, plus ``overhead`` per request."""

    def reply(request: ChatRequest) -> ChatResponse:
        question = request.messages[-1].text  # type: ignore[union-attr]
        reported = math.ceil(ratio * words(request.messages)) + overhead
        return ChatResponse(AiMessage(f"answer to {question}"), TokenUsage(reported, 3))

    return reply


class Chat(Protocol):
    def chat(self, message: str) -> str: ...


def run_turns(
    memory: TokenWindowChatMemory, ratio: float, turns: int, overhead: int = 0
) -> list[int]:
    """Drive ``turns`` service calls; return the provider's count of each request's window."""
    model = ScriptedChatModel(default=provider_counting(ratio, overhead))
    bot = ai_service(Chat, model=model, chat_memory=memory)
    for i in range(turns):
        bot.chat(f"question {i} about the order")
    return [math.ceil(ratio * words(r.messages[:-1])) for r in model.requests]


def test_a_calibrated_window_stays_within_the_models_count() -> None:
    # The model counts twice the tokens the estimator does.
    memory = TokenWindowChatMemory(60, Words(), calibrate=True)
    sizes = run_turns(memory, 2.0, 20)
    assert memory.calibration == pytest.approx(2.0)
    # Turn 0's usage is learned after its add and applied at turn 1's add; from turn 2
    # on every request's window fits 60 of the model's tokens.
    assert max(sizes[2:]) <= 60
    assert words(memory.messages()) <= 30

    uncalibrated = TokenWindowChatMemory(60, Words())
    sizes = run_turns(uncalibrated, 2.0, 20)
    assert uncalibrated.calibration == 1.0
    assert max(sizes) > 100  # without it, the window is twice too large for the model


def test_an_estimator_that_overcounts_lets_the_window_grow() -> None:
    memory = TokenWindowChatMemory(60, Words(), calibrate=True)
    run_turns(memory, 0.5, 30)
    assert memory.calibration == pytest.approx(0.5, abs=0.05)
    assert 60 < words(memory.messages()) <= 120


def test_what_the_request_carries_beside_its_messages_shrinks_the_window() -> None:
    # 40 tokens of tool definitions in every request. Calibrated, the window settles where
    # it and the definitions fill the budget (the new question comes on top); without
    # calibration the request runs 40 tokens over.
    def reported(calibrate: bool) -> list[int]:
        memory = TokenWindowChatMemory(100, Words(), calibrate=calibrate)
        model = ScriptedChatModel(default=provider_counting(1.0, overhead=40))
        bot = ai_service(Chat, model=model, chat_memory=memory)
        for i in range(30):
            bot.chat(f"question {i} about the order")
        return [words(r.messages[:-1]) + 40 for r in model.requests]

    assert max(reported(calibrate=True)) <= 100
    assert reported(calibrate=True)[-10:] == [100] * 10
    assert max(reported(calibrate=False)) == 136


def test_the_correction_applies_at_the_next_add_in_its_one_write(tmp_path: Path) -> None:
    class Writes(SqliteChatMemoryStore):
        count = 0

        def apply_changes(
            self,
            memory_id: Hashable,
            *,
            appended: Sequence[ChatMessage],
            removed: Collection[str],
        ) -> None:
            Writes.count += 1
            super().apply_changes(memory_id, appended=appended, removed=removed)

    with Writes(tmp_path / "c.db", keep_history=True) as store:
        memory = TokenWindowChatMemory(40, Words(), store=store, calibrate=True)
        for i in range(5):
            memory.add(UserMessage(f"q{i} one two three"), AiMessage(f"a{i} four five six"))
        window = memory.messages()
        assert words(window) == 40
        memory.observe_usage(window, TokenUsage(input_tokens=80))
        assert memory.calibration == 2.0
        # A read does not trim: the store still holds those messages in the window.
        assert memory.messages() == window
        assert [m.message_id for m in memory.messages()] == [m.message_id for m in window]
        Writes.count = 0
        memory.add(UserMessage("q5 one two three"), AiMessage("a5 four five six"))
        assert Writes.count == 1
        assert words(memory.messages()) <= 20
        kept = {m.message_id for m in memory.messages()}
        history = store.get_history("default")
        assert [e.evicted for e in history] == [
            m.message_id not in kept for m in [e.message for e in history]
        ]
        assert sum(not e.evicted for e in history) == len(kept)


def test_usage_that_says_nothing_is_ignored() -> None:
    memory = TokenWindowChatMemory(40, Words(), calibrate=True)
    memory.observe_usage([UserMessage("hi there")], TokenUsage(80, 1))  # nothing read yet
    memory.add(UserMessage("hello there"))
    for usage in (TokenUsage(None, 4), TokenUsage(0, 4)):
        memory.observe_usage(memory.messages(), usage)
    memory.observe_usage([AiMessage()], TokenUsage(50, 1))  # an estimate of 0
    memory.add(UserMessage("again"))
    assert memory.calibration == 1.0


def test_without_calibrate_usage_changes_nothing() -> None:
    memory = TokenWindowChatMemory(10, Words())
    memory.add(UserMessage("a b c d e"))
    memory.observe_usage(memory.messages(), TokenUsage(50, 1))
    memory.add(UserMessage("f g h i j"))
    assert memory.calibration == 1.0
    assert words(memory.messages()) == 10


def test_a_message_window_has_nothing_to_calibrate() -> None:
    assert not hasattr(MessageWindowChatMemory(), "observe_usage")


def test_each_message_is_still_counted_once() -> None:
    estimator = Words()
    memory = TokenWindowChatMemory(30, estimator, calibrate=True)
    run_turns(memory, 1.5, 25)
    assert set(estimator.counted.values()) == {1}
    assert len(estimator.counted) == 50


def test_a_callable_limit_is_corrected_too() -> None:
    memory = TokenWindowChatMemory(lambda memory_id: 60, Words(), calibrate=True)
    sizes = run_turns(memory, 2.0, 15)
    assert max(sizes[2:]) <= 60


def test_a_summarising_memory_calibrates_its_token_budget() -> None:
    summarizer = ScriptedChatModel(default="short summary")
    memory = SummarizingChatMemory(
        max_tokens=60, token_count_estimator=Words(), summarizer=summarizer, calibrate=True
    )
    model = ScriptedChatModel(default=provider_counting(2.0))
    bot = ai_service(Chat, model=model, chat_memory=memory)
    for i in range(20):
        bot.chat(f"question {i} about the order")
    assert memory.calibration == pytest.approx(2.0)
    assert words(memory.messages()) <= 30


def test_a_summarising_memory_counts_each_summary_once_too() -> None:
    # A summary a fold replaced left the window without its count: the usage check after
    # the turn counted it again.
    estimator = Words()
    memory = SummarizingChatMemory(
        max_tokens=12,
        token_count_estimator=estimator,
        summarizer=ScriptedChatModel(default="a short summary"),
        calibrate=True,
    )
    bot = ai_service(
        Chat, model=ScriptedChatModel(default=provider_counting(1.0)), chat_memory=memory
    )
    for i in range(10):
        bot.chat(f"question number {i}")
    summaries = [k for k in estimator.counted if k and k.startswith("summary-")]
    assert len(summaries) > 2  # several folds replaced a summary
    assert set(estimator.counted.values()) == {1}


async def test_async_calls_calibrate_too() -> None:
    class AsyncChat(Protocol):
        async def chat(self, message: str) -> str: ...

    memory = TokenWindowChatMemory(60, Words(), calibrate=True, store=InMemoryChatMemoryStore())
    model = ScriptedChatModel(default=provider_counting(3.0))
    bot = ai_service(AsyncChat, model=model, chat_memory=memory)
    for i in range(10):
        await bot.chat(f"question {i} about the order")
    assert memory.calibration == pytest.approx(3.0)
    assert 3 * words(memory.messages()) <= 60


def test_provider_passes_calibrate_on() -> None:
    provider = TokenWindowChatMemory.provider(60, Words(), calibrate=True)
    memory = provider("x")
    memory.add(UserMessage("one two"))
    memory.observe_usage(memory.messages(), TokenUsage(4, 1))
    memory.add(UserMessage("three"))
    assert memory.calibration == 2.0


@settings(max_examples=80, deadline=None)
@given(
    ratio=st.floats(0.3, 4.0),
    sizes=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=3, max_size=25),
    limit=st.integers(20, 120),
)
def test_from_the_second_add_on_the_window_fits_the_models_count(
    ratio: float, sizes: list[tuple[int, int]], limit: int
) -> None:
    memory = TokenWindowChatMemory(limit, Words(), calibrate=True)
    for i, (asked, answered) in enumerate(sizes):
        window = memory.messages()
        user = UserMessage(" ".join(["q"] * asked))
        memory.add(user, AiMessage(" ".join(["a"] * answered)))
        memory.observe_usage([*window, user], TokenUsage(math.ceil(ratio * words([*window, user]))))
        if i >= 1:
            kept = memory.messages()
            if len(kept) > 1:  # a single message larger than the window is kept alone
                assert ratio * words(kept) <= limit + 1e-9


def test_tool_definitions_are_left_out_of_the_window_not_divided_into_it() -> None:
    # 300 words of tool definitions in every request, and an estimator the model agrees
    # with. Taken as a ratio, the first turn ("hi" and 300 tokens of tools) would have made
    # every estimated token worth 150 and emptied the window; left out, the window keeps
    # every turn that fits beside them.
    from pydantic_core import to_json

    from aiservices import tool

    def lookup(order: str) -> str:
        return "shipped"

    lookup.__doc__ = "Look an order up. " + "detail " * 300
    lookup_tool = tool(lookup)

    def reply(request: ChatRequest) -> ChatResponse:
        tools = len(to_json(list(request.tools), fallback=str).decode().split())
        return ChatResponse(AiMessage("an answer"), TokenUsage(words(request.messages) + tools, 3))

    memory = TokenWindowChatMemory(1000, Words(), calibrate=True)
    model = ScriptedChatModel(default=reply)
    bot = ai_service(Chat, model=model, chat_memory=memory, tools=[lookup_tool])
    bot.chat("hi")
    assert memory.calibration == pytest.approx(1.0)
    for i in range(5):
        bot.chat(f"question {i} about the order")
    assert [m.text for m in model.requests[-1].messages][:2] == ["hi", "an answer"]
    assert len(model.requests[-1].messages) == 11


def test_a_message_sent_with_retrieved_texts_is_counted_as_sent() -> None:
    # The model is sent the user message with what the retriever found, under the recorded
    # message's id; an estimate of the recorded one would make an exact estimator look off.
    memory = TokenWindowChatMemory(1000, Words(), calibrate=True)
    model = ScriptedChatModel(default=provider_counting(1.0))
    bot = ai_service(
        Chat,
        model=model,
        chat_memory=memory,
        retriever=lambda query, memory_id: ["one two three four five six seven eight"] * 3,
    )
    for i in range(4):
        bot.chat(f"question {i}")
        assert memory.calibration == pytest.approx(1.0)
