"""Canonical message JSON: one message, one text, however it was built.

Stores compare the text they hold with the text of the message they are given to tell what
changed, so writing back what was read must give the very same text, or the conversation is
rewritten (and, with ``keep_history=True``, its history grows duplicates).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stores.conftest import BACKENDS, OpenedBackend, _opened

from aiservices import MemoryId, MessageWindowChatMemory, ai_service
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    Reasoning,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
    message_from_json,
    message_to_json,
    messages_from_json,
    messages_to_json,
    new_message_id,
    unchecked_message,
)
from aiservices.testing import ScriptedChatModel

# Zones an instant may be given in: each represents the same instants differently.
ZONES: list[tzinfo] = [
    UTC,
    timezone(timedelta(0), "Z"),
    timezone(timedelta(hours=2)),
    timezone(timedelta(hours=-9, minutes=-30)),
    timezone(timedelta(seconds=30)),
    timezone(timedelta(hours=13, seconds=-1, microseconds=5)),
]

# What each type's constructor takes positionally, in order.
POSITIONAL: dict[type[ChatMessage], tuple[str, ...]] = {
    SystemMessage: ("text",),
    UserMessage: ("text", "name"),
    AiMessage: ("text", "tool_execution_requests"),
    ToolExecutionResultMessage: ("id", "tool_name", "text"),
}
# Fields a constructor takes that with_metadata cannot set.
EXTRAS: dict[type[ChatMessage], tuple[str, ...]] = {
    SystemMessage: (),
    UserMessage: (),
    AiMessage: ("reasoning",),
    ToolExecutionResultMessage: ("is_error",),
}
METADATA = ("message_id", "turn_id", "created_at")
TYPE_TAGS: dict[type[ChatMessage], str] = {
    SystemMessage: "system",
    UserMessage: "user",
    AiMessage: "ai",
    ToolExecutionResultMessage: "tool_result",
}


def full(message: ChatMessage) -> tuple[type, dict[str, Any]]:
    """What equality including metadata compares: the type and every field."""
    return type(message), message.model_dump()


texts = st.text(max_size=12)
maybe_texts = st.none() | texts
requests = st.builds(ToolExecutionRequest, texts, texts, texts)
reasonings = st.builds(Reasoning, text=texts, signature=maybe_texts, redacted=maybe_texts)
# Naive times stay naive; aware ones are instants, given in any zone.
instants = st.datetimes(
    min_value=datetime(1900, 1, 2),
    max_value=datetime(2200, 1, 1),
    timezones=st.none() | st.just(UTC),
)

CONTENT: dict[type[ChatMessage], st.SearchStrategy[dict[str, Any]]] = {
    SystemMessage: st.fixed_dictionaries({"text": texts}),
    UserMessage: st.fixed_dictionaries({"text": texts, "name": maybe_texts}),
    AiMessage: st.fixed_dictionaries(
        {
            "text": maybe_texts,
            "tool_execution_requests": st.lists(requests, max_size=2),
            "reasoning": st.none() | st.lists(reasonings, max_size=2),
        }
    ),
    ToolExecutionResultMessage: st.fixed_dictionaries(
        {"id": texts, "tool_name": texts, "text": texts, "is_error": st.none() | st.booleans()}
    ),
}


@st.composite
def specs(draw: st.DrawFn) -> tuple[type[ChatMessage], dict[str, Any]]:
    """A message type and the value of each of its fields but ``type``."""
    cls = draw(st.sampled_from(list(CONTENT)))
    values = draw(CONTENT[cls])
    values["message_id"] = draw(st.none() | st.just(new_message_id()) | texts)
    values["turn_id"] = draw(maybe_texts)
    values["created_at"] = draw(st.none() | instants)
    return cls, values


def shuffled(draw: st.DrawFn, items: list[Any]) -> list[Any]:
    return list(draw(st.permutations(items)))


def retimed(draw: st.DrawFn, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``created_at``, if aware, given in a zone drawn for it."""
    at = values["created_at"]
    if at is None or at.tzinfo is None:
        return dict(values)
    return {**values, "created_at": at.astimezone(draw(st.sampled_from(ZONES)))}


Build = Callable[[st.DrawFn, type[ChatMessage], dict[str, Any]], ChatMessage]


def by_positions(draw: st.DrawFn, cls: type[ChatMessage], values: dict[str, Any]) -> ChatMessage:
    values = retimed(draw, values)
    args = [values[f] for f in POSITIONAL[cls]]
    keywords = shuffled(draw, [*EXTRAS[cls], *METADATA])
    return cls(*args, **{k: values[k] for k in keywords})


def default(cls: type[ChatMessage], name: str) -> object:
    field = cls.model_fields[name]
    return None if field.is_required() else field.get_default(call_default_factory=True)


def by_keywords(draw: st.DrawFn, cls: type[ChatMessage], values: dict[str, Any]) -> ChatMessage:
    """Keywords in any order; those at their default may be left out."""
    values = retimed(draw, values)
    names = [
        name
        for name in (*POSITIONAL[cls], *EXTRAS[cls], *METADATA)
        if values[name] != default(cls, name) or draw(st.booleans())
    ]
    return cls(**{name: values[name] for name in shuffled(draw, names)})


def by_with_metadata(
    draw: st.DrawFn, cls: type[ChatMessage], values: dict[str, Any]
) -> ChatMessage:
    """Content first, then the metadata in a chain of with_metadata calls in any order."""
    message = cls(**{k: values[k] for k in (*POSITIONAL[cls], *EXTRAS[cls])})
    for name in shuffled(draw, list(METADATA)):
        if draw(st.booleans()):
            message = message.with_metadata()
        if values[name] is not None:
            message = message.with_metadata(**{name: retimed(draw, values)[name]})
    return message


def by_unchecked(draw: st.DrawFn, cls: type[ChatMessage], values: dict[str, Any]) -> ChatMessage:
    """The framework's own path, its keys in any order (a service turn's order, say)."""
    values = retimed(draw, values)
    keys = shuffled(draw, ["type", *values])
    tagged = {**values, "type": TYPE_TAGS[cls]}
    return unchecked_message(cls, {k: tagged[k] for k in keys})


def by_validation(draw: st.DrawFn, cls: type[ChatMessage], values: dict[str, Any]) -> ChatMessage:
    values = retimed(draw, values)
    keys = shuffled(draw, list(values))
    return cls.model_validate({k: values[k] for k in keys})


BUILDS: list[Build] = [by_positions, by_keywords, by_with_metadata, by_unchecked, by_validation]


def rebuilt(draw: st.DrawFn, message: ChatMessage) -> ChatMessage:
    """The same message again, through a copy, a pickle or a JSON round trip."""
    way = draw(st.sampled_from(["json", "jsons", "copy", "deep", "update", "pickle"]))
    if way == "json":
        return message_from_json(message_to_json(message))
    if way == "jsons":
        return messages_from_json(messages_to_json([message]))[0]
    if way == "copy":
        return message.model_copy()
    if way == "deep":
        return message.model_copy(deep=True)
    if way == "update":
        at = message.created_at
        if at is not None and at.tzinfo is not None:
            at = at.astimezone(draw(st.sampled_from(ZONES)))
        return message.model_copy(update={"created_at": at, "turn_id": message.turn_id})
    return pickle.loads(pickle.dumps(message))  # type: ignore[no-any-return]


@given(st.data(), specs())
def test_a_message_built_any_way_has_one_json_text(
    data: st.DataObject, spec: tuple[type[ChatMessage], dict[str, Any]]
) -> None:
    cls, values = spec
    draw = data.draw
    built = [build(draw, cls, values) for build in BUILDS]
    built += [rebuilt(draw, draw(st.sampled_from(built))) for _ in range(3)]
    first = built[0]
    assert all(full(m) == full(first) for m in built), "the builds differ: a broken test"

    found = [message_to_json(m) for m in built]
    assert found == [found[0]] * len(found)
    # Writing a message changes nothing of it, and writing it again gives the same text.
    assert all(full(m) == full(first) and hash(m) == hash(first) for m in built)
    assert [message_to_json(m) for m in built] == found
    text = found[0]
    assert messages_to_json(built) == f'{{"format":1,"messages":[{",".join(found)}]}}'
    again = message_from_json(text)
    assert full(again) == full(first)
    assert message_to_json(again) == text


def test_the_canonical_form() -> None:
    """Fields in declaration order, ``None`` left out, times in UTC written with ``Z``."""
    at = datetime(2026, 1, 2, 5, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    user = unchecked_message(
        UserMessage,
        {
            "type": "user",
            "text": "hi",
            "name": None,
            "message_id": "m1",
            "turn_id": "t1",
            "created_at": at,
        },
    )
    assert message_to_json(user) == (
        '{"type":"user","message_id":"m1","turn_id":"t1",'
        '"created_at":"2026-01-02T03:04:05.678901Z","text":"hi"}'
    )
    naive = UserMessage("hi", created_at=datetime(2026, 1, 2, 3, 4, 5))
    assert (
        message_to_json(naive) == '{"type":"user","created_at":"2026-01-02T03:04:05","text":"hi"}'
    )
    assert message_to_json(AiMessage()) == '{"type":"ai","tool_execution_requests":[]}'


def test_text_in_the_earlier_forms_still_reads() -> None:
    """Any key order and any offset, as stored before the form was canonical."""
    stored = (
        '{"type":"user","text":"hi","name":"ann","message_id":"m1","turn_id":"t1",'
        '"created_at":"2026-01-02T05:04:05.120+02:00"}'
    )
    message = message_from_json(stored)
    assert full(message) == full(
        UserMessage(
            "hi",
            "ann",
            message_id="m1",
            turn_id="t1",
            created_at=datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC),
        )
    )
    assert json.loads(message_to_json(message))["created_at"] == "2026-01-02T03:04:05.120000Z"
    assert messages_from_json(f'{{"format":1,"messages":[{stored}]}}') == [message]


# -- write-back on every persistent store ---------------------------------------------------

PERSISTENT = [name for name, spec in BACKENDS.items() if spec.persistent and spec.history]


@pytest.fixture(params=PERSISTENT)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedBackend]:
    with _opened(request.param, tmp_path) as opened:
        yield opened


class Chat(Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def turns() -> list[list[ChatMessage]]:
    """Turns of messages built the ways a service and its callers build them."""
    paris = timezone(timedelta(hours=1))
    return [
        [
            unchecked_message(
                SystemMessage,
                {
                    "type": "system",
                    "text": "be brief",
                    "message_id": new_message_id(),
                    "turn_id": "t1",
                    "created_at": AT,
                },
            ),
            # The key order a service turn records a user message in.
            unchecked_message(
                UserMessage,
                {
                    "type": "user",
                    "text": "q1",
                    "name": None,
                    "message_id": new_message_id(),
                    "turn_id": "t1",
                    "created_at": AT,
                },
            ),
            AiMessage("a1").with_metadata(
                message_id=new_message_id(), turn_id="t1", created_at=AT.astimezone(paris)
            ),
        ],
        [
            UserMessage("q2", "ann", created_at=AT.astimezone(timezone(timedelta(hours=-5)))),
            AiMessage(
                None,
                [ToolExecutionRequest("c1", "lookup", '{"id": 1}')],
                reasoning=[Reasoning(text="look it up", signature="sig")],
                created_at=AT.astimezone(paris),
            ),
            unchecked_message(
                ToolExecutionResultMessage,
                {
                    "type": "tool_result",
                    "id": "c1",
                    "tool_name": "lookup",
                    "text": "no such id",
                    "is_error": True,
                    "message_id": new_message_id(),
                    "turn_id": None,
                    "created_at": AT.astimezone(paris),
                },
            ),
            AiMessage("a2"),
        ],
        [UserMessage("q3"), message_from_json(message_to_json(AiMessage("a3")))],
    ]


HistoryView = list[tuple[str | None, bool, datetime | None, tuple[type, dict[str, Any]]]]


def history_of(store: Any, memory_id: str) -> HistoryView:
    return [
        (e.message.message_id, e.evicted, e.evicted_at, full(e.message))
        for e in store.get_history(memory_id)
    ]


def window_of(store: Any, memory_id: str) -> list[tuple[type, dict[str, Any]]]:
    return [full(m) for m in store.get_messages(memory_id)]


def recorded(backend: OpenedBackend) -> None:
    """Turns through a memory (some evicted to history), then one through a service."""
    store = backend.open(keep_history=True)
    memory = MessageWindowChatMemory(6, id="ann", store=store)
    for turn in turns():
        memory.add(*turn)
    bot = ai_service(
        Chat,
        model=ScriptedChatModel("a4"),
        chat_memory_provider=MessageWindowChatMemory.provider(6, store=store),
    )
    assert bot.chat("ann", "q4") == "a4"


def test_writing_back_what_a_fresh_store_read_writes_nothing(backend: OpenedBackend) -> None:
    recorded(backend)
    reader = backend.open(keep_history=True)
    history, window = history_of(reader, "ann"), window_of(reader, "ann")
    assert any(evicted for _, evicted, _, _ in history)
    assert len(window) == 6

    fresh = backend.open(keep_history=True)
    fresh.update_messages("ann", fresh.get_messages("ann"))

    after = backend.open(keep_history=True)
    assert history_of(after, "ann") == history
    assert window_of(after, "ann") == window


def test_setting_its_own_messages_keeps_a_system_message_shown_first_where_it_is_stored(
    backend: OpenedBackend,
) -> None:
    # The window shows the system message first; the store keeps it where it arrived.
    memory = MessageWindowChatMemory(
        6, id="ann", store=backend.open(keep_history=True), always_keep_system_message_first=True
    )
    memory.add(UserMessage("q1"), AiMessage("a1"))
    memory.add(SystemMessage("Be brief."), UserMessage("q2"), AiMessage("a2"))
    reader = backend.open(keep_history=True)
    history, window = history_of(reader, "ann"), window_of(reader, "ann")
    assert [m["text"] for _, m in window] == ["q1", "a1", "Be brief.", "q2", "a2"]

    fresh = MessageWindowChatMemory(
        6, id="ann", store=backend.open(keep_history=True), always_keep_system_message_first=True
    )
    shown = fresh.messages()
    assert [m.text for m in shown] == ["Be brief.", "q1", "a1", "q2", "a2"]
    fresh.set(shown)
    after = backend.open(keep_history=True)
    assert history_of(after, "ann") == history
    assert window_of(after, "ann") == window

    # A message added to what was shown is the only change.
    fresh.set([*shown, UserMessage("q3")])
    after = backend.open(keep_history=True)
    assert [m["text"] for _, m in window_of(after, "ann")] == [
        "q1",
        "a1",
        "Be brief.",
        "q2",
        "a2",
        "q3",
    ]
    assert history_of(after, "ann")[:5] == history


def test_setting_a_fresh_memory_to_its_own_messages_writes_nothing(
    backend: OpenedBackend,
) -> None:
    recorded(backend)
    reader = backend.open(keep_history=True)
    history, window = history_of(reader, "ann"), window_of(reader, "ann")

    memory = MessageWindowChatMemory(6, id="ann", store=backend.open(keep_history=True))
    memory.set(memory.messages())

    after = backend.open(keep_history=True)
    assert history_of(after, "ann") == history
    assert window_of(after, "ann") == window
