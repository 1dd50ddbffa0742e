"""One turn, whichever way it is called: sync, async, sync stream, async stream, with or
without listeners, all run the same turn (``aiservices._turn``).

Message ``==`` ignores ids, turn ids and timestamps, so these tests make the ids and the
clock deterministic and compare the recorded messages field by field.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Hashable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_service_atomic import CountingStore

import aiservices._turn
import aiservices.messages
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
    tool,
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


class AsyncBot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    @system_message("Count what you are told. {{mode}}")
    async def count(self, user: Annotated[str, MemoryId], text: str, mode: str) -> int: ...

    async def answer(self, user: Annotated[str, MemoryId], text: str) -> AiMessage: ...

    async def detailed(self, user: Annotated[str, MemoryId], text: str) -> Result[str]: ...


class _Quiet:
    """A listener that does nothing but be there."""

    def on_call_start(self, info: CallInfo) -> None:
        pass


class _Clock:
    """Deterministic message ids and turn times, restarted before each way of calling."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.restart(0)

    def restart(self, base: int) -> None:
        ids = aiservices.messages._ids
        self.monkeypatch.setattr(ids, "counter", itertools.count(base * 1000 + 1))
        ticks = itertools.count()
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=base)

        def now(tz: Any = None) -> datetime:
            return start + timedelta(seconds=next(ticks))

        self.monkeypatch.setattr(aiservices._turn, "_now", now)


def _fields(messages: Sequence[ChatMessage]) -> list[tuple[Any, ...]]:
    """Every field of each message: content, ids, turn id and time."""
    return [tuple(sorted(m.__dict__.items(), key=lambda item: item[0])) for m in messages]


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


def _outcome(value: Any) -> Any:
    if isinstance(value, Result):
        ai = value.ai_message
        return (
            "result",
            value.content,
            value.token_usage,
            value.memory_id,
            value.finish_reason,
            None if ai is None else _fields([ai]),
        )
    if isinstance(value, AiMessage):
        return ("ai", _fields([value]))
    return value


def _sync_call(bot: Bot, method: str, user: str, mode: str, text: str) -> Any:
    if method == "count":
        return bot.count(user, text, mode=mode)
    return getattr(bot, method)(user, text)


def _async_call(bot: AsyncBot, method: str, user: str, mode: str, text: str) -> Any:
    if method == "count":
        return asyncio.run(bot.count(user, text, mode=mode))
    return asyncio.run(getattr(bot, method)(user, text))


@settings(max_examples=40, deadline=None)
@given(turns=st.lists(_TURN, min_size=1, max_size=6), max_messages=st.integers(2, 7))
def test_sync_async_and_listened_calls_record_the_same_messages_field_by_field(
    turns: list[tuple[str, str, str, list[str]]], max_messages: int
) -> None:
    replies = [
        _reply(kind, t, s)
        for t, (_, _, _, kinds) in enumerate(turns)
        for s, kind in enumerate(kinds)
    ]
    models = [
        ScriptedChatModel(*replies, default="fallback", usage=TokenUsage(3, 4)) for _ in "123"
    ]

    def provider() -> Any:
        return MessageWindowChatMemory.provider(max_messages=max_messages)

    sync_bot = ai_service(Bot, model=models[0], chat_memory_provider=provider())
    listened = ai_service(
        Bot, model=models[1], chat_memory_provider=provider(), listeners=[_Quiet()]
    )
    async_bot = ai_service(AsyncBot, model=models[2], chat_memory_provider=provider())
    with pytest.MonkeyPatch.context() as monkeypatch:
        clock = _Clock(monkeypatch)
        for t, (method, user, mode, _) in enumerate(turns):
            outcomes = []
            for bot, call in (
                (sync_bot, _sync_call),
                (listened, _sync_call),
                (async_bot, _async_call),
            ):
                clock.restart(t)
                try:
                    outcomes.append(("ok", _outcome(call(bot, method, user, mode, f"q{t}"))))  # type: ignore[operator]
                except Exception as error:
                    message = str(error).replace("AsyncBot.", "Bot.")
                    outcomes.append(("error", type(error), message))
            assert outcomes[0] == outcomes[1] == outcomes[2], t
            for user_id in ("alice", "bob"):
                recorded = [
                    _fields(bot.get_chat_memory(user_id).messages())
                    for bot in (sync_bot, listened, async_bot)
                ]
                assert recorded[0] == recorded[1] == recorded[2]
    requests = [
        [(list(r.messages), r.tools, r.response_format) for r in m.requests] for m in models
    ]
    assert requests[0] == requests[1] == requests[2]


class Streaming(ChatMemoryAccess, Protocol):
    @system_message("Be brief.")
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    @system_message("Be brief.")
    def stream(self, user: Annotated[str, MemoryId], text: str) -> Iterator[str]: ...

    @system_message("Be brief.")
    async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    @system_message("Be brief.")
    def astream(self, user: Annotated[str, MemoryId], text: str) -> AsyncIterator[str]: ...


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _script() -> ScriptedChatModel:
    return ScriptedChatModel(
        AiMessage(
            "Let me look.",
            [ToolExecutionRequest("w1", "weather", '{"city": "Oslo"}')],
        ),
        "Sunny in Oslo.",
    )


async def _drain(stream: AsyncIterator[str]) -> str:
    return "".join([piece async for piece in stream])


def test_every_way_of_calling_records_the_same_ids_turn_id_and_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock(monkeypatch)
    recorded: dict[str, list[tuple[Any, ...]]] = {}
    answers: dict[str, str] = {}
    for way in ("chat", "stream", "achat", "astream"):
        bot = ai_service(
            Streaming,
            model=_script(),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
            tools=[weather],
        )
        clock.restart(0)
        if way == "chat":
            answers[way] = bot.chat("alice", "Weather in Oslo?")
        elif way == "stream":
            answers[way] = "".join(bot.stream("alice", "Weather in Oslo?"))
        elif way == "achat":
            answers[way] = asyncio.run(bot.achat("alice", "Weather in Oslo?"))
        else:
            answers[way] = asyncio.run(_drain(bot.astream("alice", "Weather in Oslo?")))
        recorded[way] = _fields(bot.get_chat_memory("alice").messages())
    assert answers["chat"] == answers["achat"] == "Sunny in Oslo."
    assert answers["stream"] == answers["astream"] == "Let me look.Sunny in Oslo."
    assert recorded["chat"] == recorded["stream"] == recorded["achat"] == recorded["astream"]
    messages = dict(recorded["chat"][0])
    assert messages["type"] == "system"
    kinds = [dict(fields)["type"] for fields in recorded["chat"]]
    assert kinds == ["system", "user", "ai", "tool_result", "ai"]
    # One turn id on every message; ids and times in the order the messages were made.
    turn_ids = {dict(fields)["turn_id"] for fields in recorded["chat"]}
    assert len(turn_ids) == 1
    ids = [dict(fields)["message_id"] for fields in recorded["chat"]]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    assert turn_ids.isdisjoint(ids)
    times = [dict(fields)["created_at"] for fields in recorded["chat"]]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # Opened (system, user), answered with a tool request, the tool ran, answered.
    assert times == [start, start, *(start + timedelta(seconds=s) for s in (1, 2, 3))]


def _build(model: ScriptedChatModel, *, max_messages: int) -> Bot:
    return ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=max_messages),
    )


def test_a_turn_records_its_metadata() -> None:
    model = ScriptedChatModel("Hello!")
    bot = _build(model, max_messages=10)
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
    bot = _build(model, max_messages=10)
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
    model = ScriptedChatModel(
        AiMessage(tool_execution_requests=[request]), "Sorry, no tools.", check_tools=False
    )
    bot = _build(model, max_messages=10)
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
        "not a number",  # the count below is asked again, then parses
        "3",
        RuntimeError("provider down"),
        default="fine",
    )
    bot = ai_service(
        Bot,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4, store=store),
    )
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
