"""Stores under bad input: corrupt rows, ids and texts a store must hold, files it can't open."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Hashable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest

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
    new_message_id,
)
from aiservices.stores import CorruptMessageError, InMemoryChatMemoryStore, SqliteChatMemoryStore
from aiservices.testing import ScriptedChatModel

from ._messages import user
from ._server_backends import POSTGRES_DSN, REDIS_URL
from .conftest import OpenedBackend, _opened

# Two rows, each corrupt, that read as two other messages once joined with a comma: the
# first holds a whole user message and the start of an AI one, the second ends it.
JOINED_ONLY = [
    '{"type":"user","text":"I was the answer"},{"type":"ai","text":"?","reasoning":[{}',
    "{}]}",
]

LONE = ["\ud800", "a\udc80b", "\udfff\ud800", "x\ud83d", "\ude00y"]
"""Texts with lone surrogates: high, low, a low before a high, at either end."""


def overwrite_rows(backend: OpenedBackend, store: Any, memory_id: str, rows: list[str]) -> None:
    """Replace the stored text of the window's first ``len(rows)`` messages, behind the store."""
    if backend.name == "sqlite":
        with sqlite3.connect(store.path, isolation_level=None) as conn:
            seqs = conn.execute(
                f"SELECT seq FROM {store.table} WHERE memory_key = ? ORDER BY seq", (memory_id,)
            ).fetchall()
            for (seq,), text in zip(seqs, rows, strict=False):
                conn.execute(f"UPDATE {store.table} SET message = ? WHERE seq = ?", (text, seq))
        conn.close()
    elif backend.name == "redis":
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            for pos, text in enumerate(rows):
                client.lset(store.keys(memory_id)[0], pos, text)
        finally:
            client.close()
    elif backend.name == "postgres":
        import psycopg
        from psycopg import sql

        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            table = sql.Identifier(store.table)
            seqs = conn.execute(
                sql.SQL("SELECT seq FROM {} WHERE memory_key = %s ORDER BY seq").format(table),
                (memory_id,),
            ).fetchall()
            for (seq,), text in zip(seqs, rows, strict=False):
                conn.execute(
                    sql.SQL("UPDATE {} SET message = %s WHERE memory_key = %s AND seq = %s").format(
                        table
                    ),
                    (text, memory_id, seq),
                )
    else:
        raise AssertionError(f"no raw access to {backend.name}")


# -- corrupt rows (failure 3) -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sqlite", "redis", "postgres"])
def test_rows_that_parse_only_when_joined_are_corrupt(name: str, tmp_path: Path) -> None:
    with _opened(name, tmp_path) as backend:
        store = backend.open(keep_history=True)
        store.update_messages("alice", [user("q"), AiMessage("a", message_id=new_message_id())])
        overwrite_rows(backend, store, "alice", JOINED_ONLY)
        fresh = backend.open(keep_history=True)  # nothing parsed yet, nothing cached
        with pytest.raises(CorruptMessageError) as caught:
            fresh.get_messages("alice")
        assert caught.value.memory_id == "alice"
        with pytest.raises(CorruptMessageError, match="alice"):
            fresh.get_messages_since("alice", None)
        with pytest.raises(CorruptMessageError, match="alice"):
            fresh.get_history("alice")


def test_each_text_must_be_one_message_whatever_else_is_parsed_with_it() -> None:
    from aiservices.stores._common import parse_messages

    def corrupt(i: int, why: str) -> Exception:
        return CorruptMessageError("c", i, why)

    good = [message_to_json(user(str(i))) for i in range(3)]
    two_in_one = good[0][:-1] + "}," + good[1]  # one text holding two whole messages
    for texts in (
        [*good, *JOINED_ONLY],
        [*JOINED_ONLY, *good],
        [two_in_one, "{}"],
        [good[0] + " ", two_in_one],
    ):
        with pytest.raises(CorruptMessageError):
            parse_messages(texts, corrupt)
    assert parse_messages(good, corrupt) == [user(str(i)) for i in range(3)]


# -- ids and texts a store must hold (failures 5 and 6) -------------------------------------------


def messages_with(text: str) -> list[ChatMessage]:
    """A message of each type with ``text`` in every text field, some with times."""
    return [
        SystemMessage(text, message_id=new_message_id()),
        UserMessage(text, text, message_id=new_message_id(), created_at=datetime(2026, 1, 2)),
        AiMessage(
            text,
            [ToolExecutionRequest(text, text, text)],
            reasoning=[Reasoning(text=text, signature=text)],
            message_id=new_message_id(),
            created_at=datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        ),
        ToolExecutionResultMessage(
            text, text, text, is_error=True, message_id=new_message_id(), turn_id="t"
        ),
    ]


def dumped(messages: Sequence[ChatMessage]) -> list[tuple[type, dict[str, Any]]]:
    return [(type(m), m.model_dump()) for m in messages]


@pytest.mark.parametrize("text", LONE)
def test_a_text_with_a_lone_surrogate_serialises_and_reads_back_exactly(text: str) -> None:
    for message in messages_with(text):
        json_text = message_to_json(message)
        json_text.encode()  # storable as UTF-8 anywhere
        back = message_from_json(json_text)
        assert dumped([back]) == dumped([message])
        assert message_to_json(back) == json_text  # one message, one text


def test_a_surrogate_pair_is_the_character_it_spells() -> None:
    spelled = UserMessage("\ud83d\ude00", message_id="m")
    assert message_to_json(spelled) == message_to_json(UserMessage("😀", message_id="m"))
    assert message_from_json(message_to_json(spelled)).text == "😀"


def test_texts_with_lone_surrogates_are_stored_and_read_back_exactly(
    persistent_backend: OpenedBackend,
) -> None:
    written = [m for text in LONE for m in messages_with(text)]
    persistent_backend.open().update_messages("c", written)
    assert dumped(persistent_backend.open().get_messages("c")) == dumped(written)


IDS: list[Hashable] = ["\ud800", "a\udc80b", "a", "\x1f\udc80", "a\udc80b\x00", 1, "1"]


def test_memory_ids_with_lone_surrogates_are_stored_on_sqlite_and_kept_apart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.db"
    with SqliteChatMemoryStore(path, keep_history=True) as store:
        for memory_id in IDS:
            store.check_memory_id(memory_id)
            store.update_messages(memory_id, [user(repr(memory_id))])
            store.apply_changes(memory_id, appended=[user("more")], removed=[])
    with SqliteChatMemoryStore(path, keep_history=True) as store:
        for memory_id in IDS:
            assert [m.text for m in store.get_messages(memory_id)] == [  # type: ignore[union-attr]
                repr(memory_id),
                "more",
            ]
        assert sorted(map(repr, store.memory_ids())) == sorted(map(repr, IDS))
        store.delete_messages("\ud800")
        assert len(store.get_history("\ud800")) == 2
        store.forget("\ud800")
        assert store.get_history("\ud800") == []
        assert store.get_messages("a\udc80b") != []


def test_sqlite_refuses_an_id_longer_than_it_can_hold_before_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SqliteChatMemoryStore(tmp_path / "chat.db") as store:
        store.check_memory_id("x" * 10_000)
        monkeypatch.setattr(store, "_max_length", 1000)  # SQLite's limit is a billion bytes
        store.check_memory_id("\udc80" * 333)
        with pytest.raises(ValueError, match=r"memory id .* 1002 bytes .* 1000"):
            store.check_memory_id("\udc80" * 334)


class Chat(Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def test_a_lone_surrogate_id_and_text_go_through_a_turn_on_sqlite(tmp_path: Path) -> None:
    memory_id, question, answer = "user\udc80", "why\ud800?", "because\udfff"
    model = ScriptedChatModel(answer)
    store = SqliteChatMemoryStore(tmp_path / "chat.db")
    bot = ai_service(
        Chat, model=model, chat_memory_provider=MessageWindowChatMemory.provider(10, store=store)
    )
    assert bot.chat(memory_id, question) == answer
    assert len(model.requests) == 1
    store.close()
    with SqliteChatMemoryStore(tmp_path / "chat.db") as reopened:
        stored = reopened.get_messages(memory_id)
        assert [type(m) for m in stored] == [UserMessage, AiMessage]
        assert [m.text for m in stored] == [question, answer]  # type: ignore[union-attr]
        assert list(reopened.memory_ids()) == [memory_id]


class Refusing(InMemoryChatMemoryStore):
    """A store that can't hold ids starting with ``bad``."""

    def check_memory_id(self, memory_id: Hashable) -> None:
        if str(memory_id).startswith("bad"):
            raise ValueError(f"memory id {memory_id!r} can't be stored here; use another")


@pytest.mark.parametrize("run", ["sync", "async"])
def test_an_id_the_store_refuses_fails_before_the_model_is_called(run: str) -> None:
    import asyncio

    class AsyncChat(Protocol):
        async def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...

    model = ScriptedChatModel(default="hello")
    provider = MessageWindowChatMemory.provider(10, store=Refusing())
    if run == "sync":
        bot = ai_service(Chat, model=model, chat_memory_provider=provider)
        with pytest.raises(ValueError, match="can't be stored here"):
            bot.chat("bad id", "hi")
        assert bot.chat("good id", "hi") == "hello"
    else:
        abot = ai_service(AsyncChat, model=model, chat_memory_provider=provider)
        with pytest.raises(ValueError, match="can't be stored here"):
            asyncio.run(abot.chat("bad id", "hi"))
        assert asyncio.run(abot.chat("good id", "hi")) == "hello"
    assert len(model.requests) == 1


# -- files SQLite can't open (failure 7) ----------------------------------------------------------


def test_a_missing_directory_is_named_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no such dir" / "chat.db"
    with pytest.raises(sqlite3.OperationalError) as caught:
        SqliteChatMemoryStore(path)
    message = str(caught.value)
    assert str(path) in message
    assert f"directory {str(path.parent)!r} does not exist" in message
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert caught.value.sqlite_errorname == "SQLITE_CANTOPEN"


def test_a_directory_is_named_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError, match="is a directory") as caught:
        SqliteChatMemoryStore(tmp_path)
    assert str(tmp_path) in str(caught.value)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may open any file"
)
def test_a_file_without_permission_is_named_with_the_path(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)  # no new files: the database and its WAL can't be created
    try:
        with pytest.raises(sqlite3.OperationalError, match="permission") as caught:
            SqliteChatMemoryStore(folder / "chat.db")
        assert str(folder / "chat.db") in str(caught.value)
    finally:
        folder.chmod(0o700)
    read_only = tmp_path / "read-only.db"
    SqliteChatMemoryStore(read_only).close()
    read_only.chmod(0o400)  # SQLite would open it and fail at the first write
    with pytest.raises(sqlite3.OperationalError, match="no permission to read and write it"):
        SqliteChatMemoryStore(read_only)


def test_a_file_that_is_not_a_database_is_named_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, but long enough to have a header " * 10)
    with pytest.raises(sqlite3.OperationalError, match="not a SQLite database") as caught:
        SqliteChatMemoryStore(path)
    assert str(path) in str(caught.value)
