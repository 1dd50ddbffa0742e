"""The written-out turn of services without listeners or tools behaves as the general loop.

A sync call of such a service takes ``run_plain``; an answer that asks for tools or does not
parse hands the turn over to the general loop. Both paths must send the same requests,
return the same values, raise the same errors and record the same messages.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Annotated, Any, Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_service_atomic import CountingStore

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    ChatMessage,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    SystemMessage,
    TokenWindowChatMemory,
    ToolExecutionRequest,
    UserMessage,
    ai_service,
    system_message,
)
from aiservices.models import TokenUsage
from aiservices.observability import CallInfo
from aiservices.testing import ScriptedChatModel


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    @system_message("Count what you are told. {{mode}}")
    def count(self, user: Annotated[str, MemoryId], text: str, mode: str) -> int: ...

    def answer(self, user: Annotated[str, MemoryId], text: str) -> AiMessage: ...

    def detailed(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


class _Quiet:
    """A listener that does nothing: its presence sends every call down the general loop."""

    def on_call_start(self, info: CallInfo) -> None:
        pass


def _build(model: ScriptedChatModel, *, general: bool, max_messages: int) -> Bot:
    return ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=max_messages),
        listeners=[_Quiet()] if general else [],
    )


def _is_plain(bot: Bot) -> bool:
    return "run_plain" in type(bot).chat.__code__.co_names


# A reply, by kind: "text", "number", "bad" (not a number), "tool" (a tool nobody has),
# "error" (the model raises).
_KINDS = st.sampled_from(["text", "number", "bad", "tool", "error"])
_TURN = st.tuples(
    st.sampled_from(["chat", "count", "answer", "detailed"]),
    st.sampled_from(["alice", "bob"]),
    st.sampled_from(["terse", "verbose"]),
    st.lists(_KINDS, min_size=1, max_size=3),
)


def _reply(kind: str, turn: int, step: int) -> Any:
    if kind == "text":
        return f"text {turn}.{step}"
    if kind == "number":
        return str(turn * 10 + step)
    if kind == "bad":
        return f"not a number {turn}.{step}"
    if kind == "tool":
        return AiMessage(
            tool_execution_requests=[ToolExecutionRequest(f"c{turn}.{step}", "nope", "{}")]
        )
    return RuntimeError(f"model down {turn}.{step}")


def _call(bot: Bot, method: str, user: str, mode: str, text: str) -> Any:
    if method == "count":
        return bot.count(user, text, mode=mode)
    return getattr(bot, method)(user, text)


def _outcome(value: Any) -> Any:
    if isinstance(value, Result):
        return ("result", value.content, value.token_usage, value.memory_id, value.finish_reason)
    return value


def _requests(model: ScriptedChatModel) -> list[tuple[list[ChatMessage], Any, Any]]:
    return [(list(r.messages), r.tools, r.response_format) for r in model.requests]


@settings(max_examples=60, deadline=None)
@given(turns=st.lists(_TURN, min_size=1, max_size=8), max_messages=st.integers(2, 7))
def test_the_plain_path_and_the_general_loop_agree(
    turns: list[tuple[str, str, str, list[str]]], max_messages: int
) -> None:
    replies = [
        _reply(kind, t, s)
        for t, (_, _, _, kinds) in enumerate(turns)
        for s, kind in enumerate(kinds)
    ]
    plain_model = ScriptedChatModel(*replies, default="fallback", usage=TokenUsage(3, 4))
    general_model = ScriptedChatModel(*replies, default="fallback", usage=TokenUsage(3, 4))
    plain = _build(plain_model, general=False, max_messages=max_messages)
    general = _build(general_model, general=True, max_messages=max_messages)
    assert _is_plain(plain)
    assert not _is_plain(general)
    for t, (method, user, mode, kinds) in enumerate(turns):
        outcomes = []
        for bot in (plain, general):
            try:
                outcomes.append(("ok", _outcome(_call(bot, method, user, mode, f"q{t}"))))
            except Exception as error:
                outcomes.append(("error", type(error), str(error)))
        assert outcomes[0] == outcomes[1], (t, kinds)
        for user_id in ("alice", "bob"):
            assert (
                plain.get_chat_memory(user_id).messages()
                == general.get_chat_memory(user_id).messages()
            )
    assert _requests(plain_model) == _requests(general_model)


def test_a_plain_turn_records_metadata_as_the_general_loop_does() -> None:
    model = ScriptedChatModel("Hello!")
    bot = _build(model, general=False, max_messages=10)
    bot.chat("alice", "Hi")
    user, ai = bot.get_chat_memory("alice").messages()
    assert isinstance(user, UserMessage)
    assert isinstance(ai, AiMessage)
    assert user.turn_id == ai.turn_id is not None
    assert len({user.message_id, ai.message_id, user.turn_id}) == 3
    assert user.created_at is not None
    assert ai.created_at is not None
    assert user.created_at <= ai.created_at
    # What the model saw is the turn so far, without the answer.
    assert model.requests[0].messages == [UserMessage("Hi")]


def test_a_new_system_message_is_stamped_before_the_user_message_it_precedes() -> None:
    model = ScriptedChatModel("4")
    bot = _build(model, general=False, max_messages=10)
    assert bot.count("alice", "four things", mode="terse") == 4
    system, user, ai = bot.get_chat_memory("alice").messages()
    assert isinstance(system, SystemMessage)
    assert system.turn_id == user.turn_id == ai.turn_id
    # Ids are ordered within a process, and times never go back: both follow the record.
    assert system.message_id is not None
    assert user.message_id is not None
    assert ai.message_id is not None
    assert system.message_id < user.message_id < ai.message_id
    assert system.created_at is not None
    assert user.created_at is not None
    assert system.created_at <= user.created_at


def test_a_tool_request_without_tools_is_answered_with_an_error_then_the_turn_goes_on() -> None:
    request = ToolExecutionRequest("c1", "lookup", '{"order": "42"}')
    model = ScriptedChatModel(AiMessage(tool_execution_requests=[request]), "Sorry, no tools.")
    bot = _build(model, general=False, max_messages=10)
    assert bot.chat("alice", "Where is my order?") == "Sorry, no tools."
    kinds = [type(m).__name__ for m in bot.get_chat_memory("alice").messages()]
    assert kinds == ["UserMessage", "AiMessage", "ToolExecutionResultMessage", "AiMessage"]
    # The second request carries the first answer and the tool's error, after the question.
    second = model.requests[1].messages
    assert second[0] == UserMessage("Where is my order?")
    assert second[1] == AiMessage(tool_execution_requests=[request])
    assert "lookup" in second[2].text  # type: ignore[union-attr]
    # The first request was not changed by the turn going on after it.
    assert model.requests[0].messages == [UserMessage("Where is my order?")]


class _Recording(MessageWindowChatMemory):
    """A memory subclass with an add of its own: it must see every turn's messages."""

    def __init__(self, memory_id: Hashable) -> None:
        super().__init__(10, id=memory_id)
        self.added: list[Sequence[ChatMessage]] = []

    def add(self, *messages: ChatMessage) -> None:
        self.added.append(messages)
        super().add(*messages)


def test_a_memory_subclass_with_its_own_add_sees_each_turn() -> None:
    memories: dict[Hashable, _Recording] = {}

    def provider(memory_id: Hashable) -> _Recording:
        return memories.setdefault(memory_id, _Recording(memory_id))

    bot = ai_service(Bot, model=ScriptedChatModel("one", "two"), chat_memory_provider=provider)
    bot.chat("alice", "first")
    bot.chat("alice", "second")
    added = memories["alice"].added
    assert [[m.text for m in batch] for batch in added] == [["first", "one"], ["second", "two"]]


class _ListMemory:
    """A ChatMemory that is not ours: a plain list, no fast path."""

    def __init__(self, memory_id: Hashable) -> None:
        self.id = memory_id
        self.items: list[ChatMessage] = []

    def add(self, *messages: ChatMessage) -> None:
        self.items.extend(messages)

    def messages(self) -> list[ChatMessage]:
        return list(self.items)

    def clear(self) -> None:
        self.items.clear()

    def set(self, messages: Sequence[ChatMessage]) -> None:
        self.items = list(messages)


def test_a_memory_of_the_users_own_gets_the_turn_through_add() -> None:
    memory = _ListMemory("default")
    model = ScriptedChatModel("one", "2")
    bot = ai_service(Bot, model=model, chat_memory_provider=lambda memory_id: memory)
    bot.chat("alice", "first")
    assert bot.count("alice", "second", mode="terse") == 2  # a system message joins the turn
    assert [type(m).__name__ for m in memory.items] == [
        "UserMessage",
        "AiMessage",
        "SystemMessage",
        "UserMessage",
        "AiMessage",
    ]
    assert model.requests[1].messages[0].text == "Count what you are told. terse"


def test_a_token_window_counts_each_message_of_a_plain_turn_once() -> None:
    counted: list[str] = []

    class Estimator:
        def estimate_token_count_in_text(self, text: str) -> int:
            return len(text.split())

        def estimate_token_count_in_message(self, message: ChatMessage) -> int:
            counted.append(message.text or "")
            return len((message.text or "").split()) + 1

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default="an answer"),
        chat_memory_provider=TokenWindowChatMemory.provider(
            max_tokens=12, token_count_estimator=Estimator()
        ),
    )
    for i in range(6):
        bot.chat("alice", f"question {i}")
    assert len(counted) == 12
    kept = bot.get_chat_memory("alice").messages()
    assert sum(len((m.text or "").split()) + 1 for m in kept) <= 12
    assert [m.text for m in kept][-2:] == ["question 5", "an answer"]


def test_plain_turns_read_once_and_write_once_and_a_failed_one_writes_nothing() -> None:
    store = CountingStore()
    model = ScriptedChatModel(
        "hello",
        "not a number",  # the count below is handed over to the general loop, then parses
        "3",
        RuntimeError("provider down"),
        default="fine",
    )
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4, store=store),
    )
    assert _is_plain(bot)
    bot.chat("u", "hi")
    assert (store.reads, store.writes) == (1, 1)
    assert bot.count("u", "three things", mode="terse") == 3
    assert store.reads <= 2
    assert store.writes == 2
    before = [(m, m.message_id) for m in store.get_messages("u")]
    with pytest.raises(RuntimeError, match="provider down"):
        bot.chat("u", "this turn fails")
    assert store.writes == 2
    assert [(m, m.message_id) for m in store.get_messages("u")] == before
    reads = store.reads
    for turn in range(5):
        bot.chat("u", f"again {turn}")
        assert store.writes == 3 + turn
    assert store.reads <= reads + 5  # one read per turn at the most
