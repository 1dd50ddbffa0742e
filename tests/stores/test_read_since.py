"""Reads that reuse what a memory holds: only rows newer than its last read are parsed.

Runs on every persistent store that reads since a mark (SQLite, Redis, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from aiservices import MessageWindowChatMemory
from aiservices.messages import AiMessage, UserMessage

from ._messages import texts, user
from .conftest import OpenedBackend


@pytest.fixture
def backend(persistent_backend: OpenedBackend) -> OpenedBackend:
    return persistent_backend


def _reads_since(store: Any) -> None:
    if not callable(getattr(store, "get_messages_since", None)):
        pytest.skip(f"{type(store).__name__} has no get_messages_since")


def test_an_unchanged_window_comes_back_as_the_same_objects(backend: OpenedBackend) -> None:
    store = backend.open()
    _reads_since(store)
    store.update_messages("c", [user("a"), user("b")])
    first, since = store.get_messages_since("c")
    again, since = store.get_messages_since("c", since)
    assert texts(again) == ["a", "b"]
    assert all(x is y for x, y in zip(first, again, strict=True))


def test_new_rows_are_parsed_and_held_ones_reused(backend: OpenedBackend) -> None:
    store, other = backend.open(), backend.open()
    _reads_since(store)
    store.update_messages("c", [user("a"), user("b")])
    first, since = store.get_messages_since("c")
    other.apply_changes("c", appended=[user("c")], removed=[first[0].message_id])
    now, since = store.get_messages_since("c", since)
    assert texts(now) == ["b", "c"]
    assert now[0] is first[1]
    again, _ = store.get_messages_since("c", since)
    assert again[1] is now[1]


def test_a_conversation_emptied_and_begun_again_is_read_afresh(backend: OpenedBackend) -> None:
    # The same number of messages again, numbered from the start: a read that trusted the
    # numbers alone would show the old messages.
    store, other = backend.open(), backend.open()
    _reads_since(store)
    store.update_messages("c", [user("old 1"), user("old 2")])
    _, since = store.get_messages_since("c")
    other.delete_messages("c")
    time.sleep(0.005)
    other.update_messages("c", [user("new 1"), user("new 2")])
    now, _ = store.get_messages_since("c", since)
    assert texts(now) == ["new 1", "new 2"]


def test_a_long_conversation_emptied_and_begun_at_once_is_read_afresh(
    backend: OpenedBackend,
) -> None:
    # More messages than milliseconds passed before it was begun again, and one message
    # stored again under its id with another text: no number the reader holds may be
    # reused for another message.
    store, other = backend.open(), backend.open()
    _reads_since(store)
    old = [user(f"old {i}") for i in range(3000)]
    store.update_messages("c", old)
    _, since = store.get_messages_since("c")
    other.delete_messages("c")
    edited = old[0].model_copy(update={"text": "edited"})
    other.update_messages("c", [edited])
    now, _ = store.get_messages_since("c", since)
    assert texts(now) == ["edited"]
    assert now[0].message_id == old[0].message_id


def test_a_newest_message_removed_and_stored_again_edited_is_read_afresh(
    backend: OpenedBackend,
) -> None:
    # The first write removes the newest row and adds none; were the next write to number
    # from the highest row left, the edited message would get the number the reader holds
    # for the old text, and the reader would keep showing it.
    reader = MessageWindowChatMemory(10, id="c", store=backend.open())
    editor = MessageWindowChatMemory(10, id="c", store=backend.open())
    editor.add(UserMessage("hello"), AiMessage("The answer is A"))
    assert texts(reader.messages()) == ["hello", "The answer is A"]
    held = editor.messages()
    editor.set(held[:-1])
    editor.set([*held[:-1], held[-1].model_copy(update={"text": "The answer is B"})])
    assert texts(reader.messages()) == ["hello", "The answer is B"]


def test_a_newest_message_removed_by_apply_changes_and_appended_again_is_read_afresh(
    backend: OpenedBackend,
) -> None:
    store, other = backend.open(), backend.open()
    _reads_since(store)
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    _, since = store.get_messages_since("c")
    other.apply_changes("c", appended=[], removed=[b.message_id])
    other.apply_changes("c", appended=[b.model_copy(update={"text": "b, edited"})], removed=[])
    now, since = store.get_messages_since("c", since)
    assert texts(now) == ["a", "b, edited"]
    other.apply_changes("c", appended=[], removed=[a.message_id])
    now, _ = store.get_messages_since("c", since)
    assert texts(now) == ["b, edited"]


def test_a_window_emptied_beside_older_history_and_begun_again_is_read_afresh(
    backend: OpenedBackend,
) -> None:
    # The window is emptied by a store without history while the history holds older
    # rows: the conversation still has rows, none of them the newest number given.
    recorder, plain, reader = backend.open(keep_history=True), backend.open(), backend.open()
    _reads_since(reader)
    a, b = user("a"), user("b")
    recorder.apply_changes("c", appended=[a, b], removed=[])
    recorder.apply_changes("c", appended=[], removed=[a.message_id])
    _, since = reader.get_messages_since("c")
    plain.delete_messages("c")
    plain.apply_changes("c", appended=[b.model_copy(update={"text": "b, edited"})], removed=[])
    now, _ = reader.get_messages_since("c", since)
    assert texts(now) == ["b, edited"]


@pytest.mark.parametrize("how", ["delete_messages", "forget", "clear"])
def test_a_conversation_erased_and_begun_again_at_once_is_read_afresh(
    backend: OpenedBackend, how: str
) -> None:
    # The same message id with another text, written right after the conversation was
    # erased: numbers the reader holds must not come back for it.
    reader = MessageWindowChatMemory(10, id="c", store=backend.open())
    store = backend.open()
    editor = MessageWindowChatMemory(10, id="c", store=store)
    editor.add(UserMessage("q"), AiMessage("first answer"))
    assert texts(reader.messages()) == ["q", "first answer"]
    held = editor.messages()
    if how == "clear":
        editor.clear()
    else:
        getattr(store, how)("c")
    store.apply_changes(
        "c", appended=[m.model_copy(update={"text": f"{m.text}, again"}) for m in held], removed=[]
    )
    assert texts(reader.messages()) == ["q, again", "first answer, again"]


def test_a_window_renumbered_by_another_writer_is_read_right(backend: OpenedBackend) -> None:
    store, other = backend.open(), backend.open()
    _reads_since(store)
    a, b = user("a"), user("b")
    store.update_messages("c", [a, b])
    _, since = store.get_messages_since("c")
    changed = UserMessage("b, edited", message_id=b.message_id)
    other.update_messages("c", [changed, a])  # new order: written again
    now, _ = store.get_messages_since("c", since)
    assert texts(now) == ["b, edited", "a"]
    assert [m.message_id for m in now] == [b.message_id, a.message_id]


def test_a_memory_sees_another_writers_turn(backend: OpenedBackend) -> None:
    mine = MessageWindowChatMemory(10, id="c", store=backend.open())
    theirs = MessageWindowChatMemory(10, id="c", store=backend.open())
    mine.add(UserMessage("q1"), AiMessage("a1"))
    assert texts(mine.messages()) == ["q1", "a1"]
    theirs.add(UserMessage("q2"), AiMessage("a2"))
    assert texts(mine.messages()) == ["q1", "a1", "q2", "a2"]
    mine.add(UserMessage("q3"), AiMessage("a3"))
    assert texts(theirs.messages()) == ["q1", "a1", "q2", "a2", "q3", "a3"]
    assert texts(mine.messages()) == texts(theirs.messages())


def test_async_reads_since_match_the_sync_ones(backend: OpenedBackend) -> None:
    store = backend.open()
    if not callable(getattr(store, "aget_messages_since", None)):
        pytest.skip(f"{type(store).__name__} has no aget_messages_since")
    store.update_messages("c", [user("a"), user("b")])

    async def read() -> tuple[list[Any], list[Any]]:
        first, since = await store.aget_messages_since("c")
        store.apply_changes("c", appended=[user("c")], removed=[])
        again, _ = await store.aget_messages_since("c", since)
        close = getattr(store, "aclose", None)
        if close is not None:
            await close()
        return first, again

    first, again = asyncio.run(read())
    assert texts(again) == ["a", "b", "c"]
    assert again[0] is first[0]
