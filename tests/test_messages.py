"""Messages: immutable models, content equality, and an exact JSON round trip."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from aiservices.messages import (
    FORMAT_VERSION,
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
    message_from_json,
    message_to_json,
    messages_from_json,
    messages_to_json,
    new_message_id,
)

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def every_kind() -> list[ChatMessage]:
    return [
        SystemMessage("be brief", message_id="m0", turn_id="t1", created_at=WHEN),
        UserMessage("hi ✓ {{x}}", "alice", message_id="m1", turn_id="t1", created_at=WHEN),
        AiMessage(
            "let me look",
            [ToolExecutionRequest("c1", "lookup", '{"id": 1}'), ToolExecutionRequest("c2", "f")],
            message_id="m2",
        ),
        ToolExecutionResultMessage("c1", "lookup", '{"status": "ok"}'),
        ToolExecutionResultMessage("c2", "f", ""),
        AiMessage(),
        AiMessage("done"),
        UserMessage(""),
    ]


def dumps(messages: list[ChatMessage]) -> list[dict[str, object]]:
    return [m.model_dump() for m in messages]


def test_round_trip_is_exact_including_metadata() -> None:
    messages = every_kind()
    again = messages_from_json(messages_to_json(messages))
    assert dumps(again) == dumps(messages)
    assert [type(m) for m in again] == [type(m) for m in messages]


def test_json_carries_a_type_tag_and_the_format_version() -> None:
    data = json.loads(messages_to_json([UserMessage("hi"), AiMessage("yo")]))
    assert data["format"] == FORMAT_VERSION
    assert [m["type"] for m in data["messages"]] == ["user", "ai"]


def test_one_message_round_trips() -> None:
    for message in every_kind():
        assert message_from_json(message_to_json(message)).model_dump() == message.model_dump()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"format": 1, "messages": [', "not valid"),
        ("", "not valid"),
        ("[]", "must be an object"),
        ('{"messages": []}', "must be an object"),
        ('{"format": 2, "messages": []}', "newer"),
        ('{"format": "1", "messages": []}', "non-integer"),
        ('{"format": 1, "messages": [{"type": "robot", "text": "x"}]}', "robot"),
        ('{"format": 1, "messages": [{"type": "user", "text": 5}]}', "text"),
        ('{"format": 1, "messages": [{"type": "user"}]}', "text"),
        ('{"format": 1, "messages": [{"type": "user", "text": "x", "extra": 1}]}', "extra"),
        (
            '{"format": 1, "messages": [{"type": "ai", "tool_execution_requests": [{"id": 1}]}]}',
            "tool_execution_requests",
        ),
        (
            '{"format": 1, "messages": [{"type": "user", "text": "x", "created_at": "soon"}]}',
            "created_at",
        ),
        ('{"format": 1, "messages": {"type": "user"}}', "messages"),
    ],
)
def test_malformed_json_is_a_value_error_saying_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        messages_from_json(text)


def test_a_malformed_single_message_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid chat message"):
        message_from_json('{"type": "user"}')


def test_equality_compares_content_not_metadata() -> None:
    recorded = UserMessage("hi", message_id="a", turn_id="t", created_at=WHEN)
    assert recorded == UserMessage("hi")
    assert hash(recorded) == hash(UserMessage("hi"))
    assert UserMessage("hi") != UserMessage("hi", "bob")
    assert UserMessage("hi") != SystemMessage("hi")
    assert AiMessage("x", [ToolExecutionRequest("1", "f")]) != AiMessage("x")
    assert len({AiMessage("x"), AiMessage("x", message_id="z")}) == 1


def test_messages_are_immutable_and_validated() -> None:
    message = UserMessage("hi")
    with pytest.raises(ValidationError):
        message.text = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        UserMessage(42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ToolExecutionResultMessage("id", "tool", None)  # type: ignore[arg-type]


def test_positional_and_keyword_construction_agree() -> None:
    assert UserMessage("hi", "bob") == UserMessage(text="hi", name="bob")
    assert ToolExecutionRequest("1", "f", "{}") == ToolExecutionRequest(
        id="1", name="f", arguments="{}"
    )
    assert AiMessage(
        tool_execution_requests=[ToolExecutionRequest("1", "f")]
    ).has_tool_execution_requests


def test_with_metadata_copies_and_keeps_content() -> None:
    message = UserMessage("hi", "bob")
    stamped = message.with_metadata(message_id="m", turn_id="t", created_at=WHEN)
    assert stamped == message
    assert (stamped.message_id, stamped.turn_id, stamped.created_at) == ("m", "t", WHEN)
    assert message.message_id is None
    assert stamped.with_metadata().model_dump() == stamped.model_dump()


def test_message_ids_are_unique_and_ordered() -> None:
    ids = [new_message_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert ids == sorted(ids)
    assert all(len(i) == 32 for i in ids)
    assert all(int(i, 16) >= 0 for i in ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_ids_of_its_own() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write_end, new_message_id().encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    child = os.read(read_end, 64).decode()
    os.close(read_end)
    parent = new_message_id()
    assert len(child) == 32
    # Same counter position, different per-process prefix.
    assert child[:20] != parent[:20]


texts = st.text(max_size=30)
user_messages = st.builds(UserMessage, texts, st.none() | texts)
ai_messages = st.builds(
    AiMessage,
    st.none() | texts,
    st.lists(st.builds(ToolExecutionRequest, texts, texts, texts), max_size=3),
)
any_message = st.one_of(
    st.builds(SystemMessage, texts),
    user_messages,
    ai_messages,
    st.builds(ToolExecutionResultMessage, texts, texts, texts),
)


@given(st.lists(any_message, max_size=8))
def test_any_conversation_round_trips(messages: list[ChatMessage]) -> None:
    assert dumps(messages_from_json(messages_to_json(messages))) == dumps(messages)


def test_recorded_messages_share_a_frozen_fields_set_and_copies_get_their_own() -> None:
    from typing import Annotated, Protocol

    from aiservices import MemoryId, MessageWindowChatMemory, ai_service
    from aiservices.testing import ScriptedChatModel

    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel("one", "two"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
    )
    bot.chat("a", "first")
    bot.chat("b", "second")
    memory_a = bot.get_chat_memory("a")  # type: ignore[attr-defined]
    memory_b = bot.get_chat_memory("b")  # type: ignore[attr-defined]
    user_a, ai_a = memory_a.messages()
    user_b, _ = memory_b.messages()
    assert user_a.model_fields_set is user_b.model_fields_set
    assert user_a.model_fields_set == set(UserMessage.model_fields)
    # model_copy(update=...) changes a set of the copy's own, not the shared one.
    for deep in (False, True):
        copied = ai_a.model_copy(update={"text": "changed"}, deep=deep)
        assert copied.text == "changed"
        assert copied.model_fields_set is not ai_a.model_fields_set
    assert ai_a.text == "one"
    assert user_a.model_fields_set == set(UserMessage.model_fields)


def test_recorded_messages_dump_copy_and_pickle_as_any_message() -> None:
    import pickle
    from typing import Annotated, Protocol

    from aiservices import MemoryId, MessageWindowChatMemory, ai_service
    from aiservices.testing import ScriptedChatModel

    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> AiMessage: ...

    bot = ai_service(
        Bot,
        model=ScriptedChatModel("hello"),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=10),
    )
    answer = bot.chat("a", "hi")
    user = bot.get_chat_memory("a").messages()[0]  # type: ignore[attr-defined]
    for message in (answer, user):
        dumped = message.model_dump(exclude_unset=True)
        assert dumped["message_id"] == message.message_id
        assert message.model_dump_json(exclude_unset=True)
        again = pickle.loads(pickle.dumps(message))
        assert again == message
        assert again.message_id == message.message_id
    with pytest.raises(TypeError, match="shared by recorded messages"):
        user.model_fields_set.add("x")


def test_a_list_with_a_lone_surrogate_reads_back_exactly() -> None:

    text = b"bad byte: \xff".decode("utf-8", "surrogateescape")
    messages = [UserMessage(text), AiMessage("fine")]
    [user, ai] = messages_from_json(messages_to_json(messages))
    assert user.text == text
    assert ai.text == "fine"


def test_with_metadata_refuses_what_the_constructor_refuses() -> None:
    message = UserMessage("hi")
    with pytest.raises(TypeError, match="message_id must be a str, not int"):
        message.with_metadata(message_id=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="turn_id must be a str"):
        message.with_metadata(turn_id=b"t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="created_at must be a datetime, not str"):
        message.with_metadata(created_at="2024-01-01T00:00:00Z")  # type: ignore[arg-type]
