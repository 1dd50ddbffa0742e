"""Checked writes: ``apply_changes(..., since=)`` writes only on the conversation it was
planned on, for every store."""

from __future__ import annotations

from typing import Any

import pytest

from aiservices.messages import AiMessage, new_message_id
from aiservices.stores import ConcurrentChangeError

from ._messages import texts, user
from .conftest import OpenedBackend


def two_writers(backend: OpenedBackend, **options: Any) -> tuple[Any, Any]:
    """Two store objects on the same data (one object twice for a store in memory)."""
    first = backend.open(**options)
    return first, backend.open(**options) if backend.spec.persistent else first


def since_of(store: Any, memory_id: str) -> object:
    return store.get_messages_since(memory_id)[1]


def test_a_write_planned_on_the_current_read_is_applied(store: Any) -> None:
    a = user("a")
    store.apply_changes("c", appended=[a], removed=[])
    since = since_of(store, "c")
    after = store.apply_changes("c", appended=[user("b")], removed=[a.message_id], since=since)
    assert texts(store.get_messages("c")) == ["b"]
    # What a checked write returns plans the next one, and reads like any since.
    store.apply_changes("c", appended=[user("c")], removed=[], since=after)
    messages, _ = store.get_messages_since("c", after)
    assert texts(messages) == ["b", "c"]


def test_a_write_planned_before_another_writer_appended_writes_nothing(
    backend: OpenedBackend,
) -> None:
    one, two = two_writers(backend)
    a = user("a")
    one.apply_changes("c", appended=[a], removed=[])
    since = since_of(one, "c")
    two.apply_changes("c", appended=[user("b")], removed=[])
    with pytest.raises(ConcurrentChangeError) as raised:
        one.apply_changes("c", appended=[user("x")], removed=[a.message_id], since=since)
    assert raised.value.memory_id == "c"
    assert texts(one.get_messages("c")) == ["a", "b"]
    # Read again, the write goes through.
    one.apply_changes("c", appended=[user("x")], removed=[a.message_id], since=since_of(one, "c"))
    assert texts(two.get_messages("c")) == ["b", "x"]


def test_a_write_planned_on_an_empty_conversation_another_writer_began(
    backend: OpenedBackend,
) -> None:
    one, two = two_writers(backend)
    since = since_of(one, "c")
    two.apply_changes("c", appended=[user("first")], removed=[])
    with pytest.raises(ConcurrentChangeError):
        one.apply_changes("c", appended=[user("also first")], removed=[], since=since)
    assert texts(one.get_messages("c")) == ["first"]


def test_a_write_returned_since_is_stale_once_another_writer_appends(
    backend: OpenedBackend,
) -> None:
    one, two = two_writers(backend)
    after = one.apply_changes("c", appended=[user("a")], removed=[], since=since_of(one, "c"))
    two.apply_changes("c", appended=[user("b")], removed=[])
    with pytest.raises(ConcurrentChangeError):
        one.apply_changes("c", appended=[user("x")], removed=[], since=after)
    assert texts(two.get_messages("c")) == ["a", "b"]


def test_a_write_planned_before_the_conversation_was_emptied(backend: OpenedBackend) -> None:
    one, two = two_writers(backend)
    a = user("a")
    one.apply_changes("c", appended=[a, user("b")], removed=[])
    since = since_of(one, "c")
    two.delete_messages("c")
    with pytest.raises(ConcurrentChangeError):
        one.apply_changes("c", appended=[user("x")], removed=[a.message_id], since=since)
    assert one.get_messages("c") == []


def test_with_history_a_write_planned_before_the_window_was_emptied(
    history_backend: OpenedBackend,
) -> None:
    one, two = two_writers(history_backend, keep_history=True)
    a = user("a")
    one.apply_changes("c", appended=[a], removed=[])
    since = since_of(one, "c")
    two.delete_messages("c")
    with pytest.raises(ConcurrentChangeError):
        one.apply_changes("c", appended=[user("x")], removed=[a.message_id], since=since)
    assert one.get_messages("c") == []
    assert [e.message.text for e in one.get_history("c")] == ["a"]


def test_a_write_planned_before_the_conversation_was_forgotten(
    history_backend: OpenedBackend,
) -> None:
    one, two = two_writers(history_backend, keep_history=True)
    one.apply_changes("c", appended=[user("secret")], removed=[])
    since = since_of(one, "c")
    two.forget("c")
    with pytest.raises(ConcurrentChangeError):
        one.apply_changes("c", appended=[user("x")], removed=[], since=since)
    assert one.get_history("c") == []


def test_a_checked_removal_and_history_only_write(history_backend: OpenedBackend) -> None:
    store = history_backend.open(keep_history=True)
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    after = store.apply_changes(
        "c", appended=[], removed=[a.message_id], since=since_of(store, "c")
    )
    after = store.apply_changes(
        "c", appended=[], removed=[], history_only=[user("passing")], since=after
    )
    answer = AiMessage("c", message_id=new_message_id())
    store.apply_changes("c", appended=[answer], removed=[], since=after)
    assert texts(store.get_messages("c")) == ["b", "c"]
    assert [e.message.text for e in store.get_history("c")] == ["a", "b", "passing", "c"]


def test_an_unchecked_write_is_applied_as_before(backend: OpenedBackend) -> None:
    one, two = two_writers(backend)
    one.apply_changes("c", appended=[user("a")], removed=[])
    two.apply_changes("c", appended=[user("b")], removed=[], since=None)
    assert texts(one.get_messages("c")) == ["a", "b"]


async def test_async_checked_writes(backend: OpenedBackend) -> None:
    one, two = two_writers(backend)
    if not hasattr(one, "aapply_changes"):
        pytest.skip("the store has no async methods: async callers use its sync ones")
    try:
        _, since = await one.aget_messages_since("c")
        after = await one.aapply_changes("c", appended=[user("a")], removed=[], since=since)
        await two.aapply_changes("c", appended=[user("b")], removed=[])
        with pytest.raises(ConcurrentChangeError):
            await one.aapply_changes("c", appended=[user("x")], removed=[], since=after)
        assert texts(await one.aget_messages("c")) == ["a", "b"]
    finally:
        for store in {id(one): one, id(two): two}.values():
            close = getattr(store, "aclose", None)
            if close is not None:
                await close()
