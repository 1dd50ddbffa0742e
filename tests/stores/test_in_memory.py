"""InMemoryChatMemoryStore beyond the contract: no I/O, shared message objects, no leftovers."""

from __future__ import annotations

from aiservices.messages import SystemMessage, new_message_id
from aiservices.stores import (
    AsyncChatMemoryStore,
    IncrementalChatMemoryStore,
    InMemoryChatMemoryStore,
)

from ._messages import user


def test_it_is_an_incremental_store_that_does_no_io() -> None:
    store = InMemoryChatMemoryStore()
    assert isinstance(store, IncrementalChatMemoryStore)
    assert not isinstance(store, AsyncChatMemoryStore)
    assert store.is_blocking is False


def test_reads_share_the_immutable_messages_in_a_new_list() -> None:
    store = InMemoryChatMemoryStore()
    message = user("a")
    store.apply_changes("c", appended=[message], removed=[])
    first, second = store.get_messages("c"), store.get_messages("c")
    assert first is not second
    assert first[0] is message


def test_an_emptied_conversation_leaves_nothing_behind() -> None:
    store = InMemoryChatMemoryStore()
    a, b = user("a"), user("b")
    store.apply_changes("x", appended=[a, b], removed=[])
    store.apply_changes("x", appended=[], removed=[a.message_id, b.message_id])
    store.update_messages("y", [user("y")])
    store.update_messages("y", [])
    store.apply_changes("z", appended=[], removed=["nothing"])
    store.update_messages("w", [user("w")])
    store.forget("w")
    assert store._conversations == {}


def test_removals_behind_a_pinned_system_message_and_at_the_end() -> None:
    store = InMemoryChatMemoryStore()
    sys = SystemMessage("pinned", message_id=new_message_id())
    window = [sys, *(user(str(i)) for i in range(10))]
    store.update_messages("c", window)
    store.apply_changes(
        "c",
        appended=[user("10")],
        removed=[window[1].message_id, window[2].message_id, window[10].message_id],
    )
    assert [m.text for m in store.get_messages("c")] == ["pinned", *map(str, range(2, 9)), "10"]
    store.apply_changes("c", appended=[], removed=[window[3].message_id, window[3].message_id])
    assert [m.text for m in store.get_messages("c")] == ["pinned", *map(str, range(3, 9)), "10"]


def test_a_removed_id_can_come_back() -> None:
    store = InMemoryChatMemoryStore()
    a = user("a")
    store.apply_changes("c", appended=[a], removed=[])
    store.apply_changes("c", appended=[], removed=[a.message_id])
    store.apply_changes("c", appended=[user("b"), a], removed=[])
    assert [m.text for m in store.get_messages("c")] == ["b", "a"]
