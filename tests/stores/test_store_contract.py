"""The store contract: every store passes this suite unchanged (backends: conftest.py)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiservices import MessageWindowChatMemory
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionRequest,
    ToolExecutionResultMessage,
    UserMessage,
    new_message_id,
)
from aiservices.stores import HistoryEntry, store_key

from ._messages import texts, user
from ._processes import in_processes
from .conftest import OpenedBackend


def dumps(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    return [m.model_dump() for m in messages]


def ids(messages: Sequence[ChatMessage]) -> list[str | None]:
    return [m.message_id for m in messages]


EVERY_KIND: list[ChatMessage] = [
    SystemMessage("You are helpful.", message_id="m-system"),
    UserMessage(
        'Hi, I am "Alice" \\ \n\t ünïcødé 🙂 \x00',
        "alice",
        message_id="m-user",
        turn_id="turn-1",
        created_at=datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC),
    ),
    AiMessage(
        None,
        [
            ToolExecutionRequest("call-1", "weather", '{"city": "Paris"}'),
            ToolExecutionRequest("call-2", "time", "{}"),
        ],
        message_id="m-ai-tools",
        turn_id="turn-1",
        created_at=datetime(2024, 5, 1, 14, 30, tzinfo=timezone(timedelta(hours=2))),
    ),
    ToolExecutionResultMessage("call-1", "weather", "sunny, 21°C", message_id="m-result-1"),
    ToolExecutionResultMessage("call-2", "time", "", message_id="m-result-2"),
    AiMessage("It is sunny.", message_id="m-ai", created_at=datetime(2024, 5, 1, 12, 31)),
    AiMessage("", message_id="m-ai-empty"),
    UserMessage("", message_id="m-user-empty"),
]


# -- reads and deletes of unknown ids ---------------------------------------------------


def test_unknown_id_reads_empty(store: Any) -> None:
    assert store.get_messages("nobody") == []
    assert store.get_messages(12345) == []


def test_delete_of_unknown_id_is_a_no_op(store: Any) -> None:
    store.update_messages("kept", [user("stay")])
    store.delete_messages("nobody")
    store.delete_messages(("no", "body"))
    assert texts(store.get_messages("kept")) == ["stay"]


def test_delete_removes_only_that_conversation(store: Any) -> None:
    store.update_messages("a", [user("a1"), user("a2")])
    store.update_messages("b", [user("b1")])
    store.delete_messages("a")
    assert store.get_messages("a") == []
    assert texts(store.get_messages("b")) == ["b1"]
    store.apply_changes("a", appended=[user("again")], removed=[])
    assert texts(store.get_messages("a")) == ["again"]


# -- round trips --------------------------------------------------------------------------


def test_every_message_kind_round_trips_exactly(store: Any) -> None:
    store.update_messages("kinds", EVERY_KIND)
    got = store.get_messages("kinds")
    assert dumps(got) == dumps(EVERY_KIND)
    assert [type(m) for m in got] == [type(m) for m in EVERY_KIND]


def test_every_message_kind_round_trips_through_apply_changes(store: Any) -> None:
    store.apply_changes("kinds", appended=EVERY_KIND[:3], removed=[])
    store.apply_changes("kinds", appended=EVERY_KIND[3:], removed=[])
    assert dumps(store.get_messages("kinds")) == dumps(EVERY_KIND)


def test_update_then_get_replaces_the_conversation(store: Any) -> None:
    first = [user("one"), user("two")]
    store.update_messages("c", first)
    assert dumps(store.get_messages("c")) == dumps(first)
    second = [SystemMessage("sys", message_id=new_message_id()), user("three")]
    store.update_messages("c", second)
    assert dumps(store.get_messages("c")) == dumps(second)


def test_update_with_no_messages_empties_the_conversation(store: Any) -> None:
    store.update_messages("c", [user("one")])
    store.update_messages("c", [])
    assert store.get_messages("c") == []
    store.update_messages("never-written", [])
    assert store.get_messages("never-written") == []


def test_messages_without_an_id_get_one_that_stays(store: Any) -> None:
    store.update_messages("c", [UserMessage("no id"), AiMessage("none either")])
    got = store.get_messages("c")
    assert got == [UserMessage("no id"), AiMessage("none either")]
    assert all(m.message_id for m in got)
    assert len(set(ids(got))) == 2
    assert ids(store.get_messages("c")) == ids(got)
    store.apply_changes("c", appended=[user("more")], removed=[got[0].message_id])
    assert texts(store.get_messages("c")) == ["none either", "more"]


# -- apply_changes ------------------------------------------------------------------------


def test_apply_changes_appends_to_a_new_conversation(store: Any) -> None:
    msgs = [user("a"), user("b")]
    store.apply_changes("new", appended=msgs, removed=[])
    assert dumps(store.get_messages("new")) == dumps(msgs)


def test_apply_changes_removes_then_appends(store: Any) -> None:
    msgs = [user(str(i)) for i in range(6)]
    store.update_messages("c", msgs)
    store.apply_changes(
        "c", appended=[user("6"), user("7")], removed={msgs[0].message_id, msgs[1].message_id}
    )
    assert texts(store.get_messages("c")) == ["2", "3", "4", "5", "6", "7"]


def test_apply_changes_removes_from_anywhere(store: Any) -> None:
    sys = SystemMessage("pinned", message_id=new_message_id())
    msgs = [sys] + [user(str(i)) for i in range(5)]
    store.update_messages("c", msgs)
    store.apply_changes("c", appended=[], removed=[msgs[1].message_id, msgs[4].message_id])
    assert texts(store.get_messages("c")) == ["pinned", "1", "2", "4"]
    store.apply_changes("c", appended=[], removed=[msgs[5].message_id])
    assert texts(store.get_messages("c")) == ["pinned", "1", "2"]


def test_apply_changes_ignores_unknown_removed_ids(store: Any) -> None:
    store.apply_changes("c", appended=[user("a")], removed=["not-there"])
    store.apply_changes("c", appended=[], removed=["not-there", "nor-this"])
    store.apply_changes("unknown", appended=[], removed=["x"])
    assert texts(store.get_messages("c")) == ["a"]
    assert store.get_messages("unknown") == []


def test_apply_changes_removing_everything_leaves_an_empty_conversation(store: Any) -> None:
    msgs = [user("a"), user("b")]
    store.apply_changes("c", appended=msgs, removed=[])
    store.apply_changes("c", appended=[], removed=ids(msgs))
    assert store.get_messages("c") == []
    store.apply_changes("c", appended=[user("c")], removed=[])
    assert texts(store.get_messages("c")) == ["c"]


def test_apply_changes_keeps_what_another_writer_appended(backend: OpenedBackend) -> None:
    # Two writers that both loaded ["a", "b"]: each evicts "a" and appends its own message.
    writer_1, writer_2 = backend.open(), backend.open()
    if not backend.spec.persistent:
        writer_2 = writer_1
    a, b = user("a"), user("b")
    writer_1.update_messages("c", [a, b])
    writer_1.apply_changes("c", appended=[user("from 1")], removed=[a.message_id])
    writer_2.apply_changes("c", appended=[user("from 2")], removed=[a.message_id])
    assert texts(writer_1.get_messages("c")) == ["b", "from 1", "from 2"]


def test_apply_changes_may_append_again_a_message_it_removes(store: Any) -> None:
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    store.apply_changes("c", appended=[a], removed=[a.message_id])
    assert texts(store.get_messages("c")) == ["b", "a"]


def test_apply_changes_refuses_a_message_without_id_and_changes_nothing(store: Any) -> None:
    keep = user("keep")
    store.apply_changes("c", appended=[keep], removed=[])
    with pytest.raises(ValueError, match=r"message_id.*with_metadata"):
        store.apply_changes("c", appended=[user("ok"), UserMessage("no id")], removed=[])
    with pytest.raises(ValueError, match="message_id"):
        store.apply_changes("c", appended=[UserMessage("no id")], removed=[keep.message_id])
    assert dumps(store.get_messages("c")) == dumps([keep])


def test_duplicate_message_ids_are_refused_and_change_nothing(store: Any) -> None:
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    twin = user("twin", message_id=b.message_id)
    with pytest.raises(ValueError, match="appears twice"):
        store.apply_changes("c", appended=[twin], removed=[a.message_id])
    new = user("new")
    with pytest.raises(ValueError, match="appears twice"):
        store.apply_changes("c", appended=[new, new], removed=[])
    with pytest.raises(ValueError, match="appears twice"):
        store.update_messages("c", [a, b, twin])
    assert dumps(store.get_messages("c")) == dumps([a, b])


def test_a_text_given_for_a_list_is_a_type_error_and_changes_nothing(store: Any) -> None:
    # A str is a sequence of its characters: taken as a list, "abc" would remove the
    # messages with ids "a", "b" and "c", and "hi" would be stored as two broken messages.
    a = user("kept", message_id="a")
    store.apply_changes("c", appended=[a], removed=[])
    with pytest.raises(TypeError, match="removed must be a list of message ids, not str 'abc'"):
        store.apply_changes("c", appended=[user("new")], removed="abc")
    with pytest.raises(TypeError, match="appended must be a list of chat messages, not str"):
        store.apply_changes("c", appended="hi", removed=[])
    with pytest.raises(TypeError, match="appended must be a list of chat messages, not one"):
        store.apply_changes("c", appended=user("one"), removed=[])
    with pytest.raises(TypeError, match="messages must be a list of chat messages, not str 'hi'"):
        store.update_messages("c", "hi")
    with pytest.raises(TypeError, match=r"not one message UserMessage\(.*put it in a list"):
        store.update_messages("c", user("one"))
    assert dumps(store.get_messages("c")) == dumps([a])


def test_a_duplicate_after_new_messages_is_the_one_named(store: Any) -> None:
    stored = user("stored")
    store.apply_changes("c", appended=[stored], removed=[])
    fresh, twin = user("fresh"), user("twin", message_id=stored.message_id)
    with pytest.raises(ValueError, match="appears twice") as info:
        store.apply_changes("c", appended=[fresh, twin], removed=[])
    assert repr(stored.message_id) in str(info.value)
    assert fresh.message_id not in str(info.value)
    assert dumps(store.get_messages("c")) == dumps([stored])


def test_an_id_removed_twice_in_one_call_is_removed_once(backend: OpenedBackend) -> None:
    store = backend.open(keep_history=True) if backend.spec.history else backend.open()
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    store.apply_changes("c", appended=[user("c")], removed=[a.message_id, a.message_id])
    assert texts(store.get_messages("c")) == ["b", "c"]
    if backend.spec.history:
        assert history_view(store.get_history("c")) == [("a", True), ("b", False), ("c", False)]


# -- update_messages that reorders or replaces ---------------------------------------------


@pytest.mark.parametrize(
    "order",
    [
        pytest.param([1, 2, 3, 4], id="drop-front"),
        pytest.param([0, 2, 4], id="drop-middle"),
        pytest.param([4, 3, 2, 1, 0], id="reverse"),
        pytest.param([0, "new", 1, 2, 3, 4], id="insert-inside"),
        pytest.param(["new", 0, 1, 2, 3, 4], id="insert-front"),
        pytest.param([1, 0, 2, 3, 4, "new"], id="swap-and-append"),
        pytest.param(["new"], id="replace-all"),
        pytest.param([0, 1, 2, 3, 4, "new", "new"], id="append"),
    ],
)
def test_update_messages_reaches_any_order(store: Any, order: list[int | str]) -> None:
    old = [user(f"old {i}") for i in range(5)]
    store.update_messages("c", old)
    wanted = [old[i] if isinstance(i, int) else user("new") for i in order]
    store.update_messages("c", wanted)
    assert dumps(store.get_messages("c")) == dumps(wanted)
    store.apply_changes("c", appended=[user("after")], removed=[wanted[0].message_id])
    assert dumps(store.get_messages("c")) == dumps([*wanted[1:], store.get_messages("c")[-1]])


def test_an_empty_message_id_is_an_id_like_any_other(store: Any) -> None:
    a, b = user("a", message_id=""), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    store.update_messages("c", [b])
    assert texts(store.get_messages("c")) == ["b"]
    store.apply_changes("c", appended=[user("a again", message_id="")], removed=[])
    assert texts(store.get_messages("c")) == ["b", "a again"]


def test_update_messages_replaces_a_changed_message_with_the_same_id(store: Any) -> None:
    a, b, c = user("a"), user("b"), user("c")
    store.update_messages("c", [a, b, c])
    edited = UserMessage("b, edited", message_id=b.message_id, turn_id="t2")
    store.update_messages("c", [a, edited, c])
    assert dumps(store.get_messages("c")) == dumps([a, edited, c])


# -- copies -------------------------------------------------------------------------------


def test_returned_lists_are_copies(store: Any) -> None:
    msgs = [user("a"), user("b")]
    store.update_messages("c", msgs)
    got = store.get_messages("c")
    got.append(user("mine"))
    got.pop(0)
    assert texts(store.get_messages("c")) == ["a", "b"]
    assert store.get_messages("c") is not store.get_messages("c")


def test_the_lists_given_are_not_kept(store: Any) -> None:
    msgs = [user("a"), user("b")]
    store.update_messages("c", msgs)
    msgs.append(user("later"))
    appended = [user("c")]
    store.apply_changes("c", appended=appended, removed=[])
    appended.append(user("later too"))
    assert texts(store.get_messages("c")) == ["a", "b", "c"]


# -- memory ids -----------------------------------------------------------------------------

MEMORY_IDS: list[Hashable] = [
    1,
    "1",
    "int:1",
    "\x1fint:1",
    1.5,
    "1.5",
    True,
    "True",
    "",
    " ",
    "a:b",
    "a",
    "b",
    "*",
    "a*",
    "?",
    "[ab]",
    "%",
    "_",
    "a b",
    " a",
    "a ",
    "ключ",
    "鍵",
    "🙂",
    "a\nb",
    "x" * 500,
    ("tuple", 1),
    uuid.UUID(int=7),
    str(uuid.UUID(int=7)),
    "'; DROP TABLE chat_messages; --",
]


def test_equal_frozenset_ids_file_under_one_key_in_every_process() -> None:
    # A frozenset's iteration order follows string hashes, which each process seeds anew.
    import subprocess
    import sys

    script = (
        "from aiservices.stores import store_key; "
        "print(repr(store_key(frozenset({'alice', 'bob', 'carol', 'dave'}))), "
        "repr(store_key(('team', frozenset({'x', 'y', 'z'})))))"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(6)
    }
    assert len(keys) == 1, keys
    assert store_key(("tuple", 1)) == "\x1ftuple:('tuple', 1)"  # tuples file as before


class _Session:
    """An id whose text is its address: object's own repr."""

    def __init__(self, user: str) -> None:
        self.user = user


class _NamedSession(_Session):
    def __repr__(self) -> str:
        return f"_NamedSession({self.user!r})"


def test_an_id_whose_text_is_its_address_is_refused(store: Any) -> None:
    # Filed under "<_Session object at 0x...>", another object at that address later would
    # continue the conversation, and an equal one never finds it.
    for memory_id in (_Session("alice"), ("team", _Session("bob"))):
        with pytest.raises(TypeError, match="_Session has neither __str__ nor __repr__"):
            store.get_messages(memory_id)
        with pytest.raises(TypeError, match="its text is its address"):
            store.apply_changes(memory_id, appended=[user("hi")], removed=[])
    named = _NamedSession("carol")
    store.apply_changes(named, appended=[user("hi")], removed=[])
    assert [m.text for m in store.get_messages(_NamedSession("carol"))] == ["hi"]


def test_memory_ids_are_isolated(store: Any) -> None:
    assert len({store_key(i) for i in MEMORY_IDS}) == len(MEMORY_IDS)
    for n, memory_id in enumerate(MEMORY_IDS):
        store.update_messages(memory_id, [user(f"update {n}")])
        store.apply_changes(memory_id, appended=[user(f"append {n}")], removed=[])
    for n, memory_id in enumerate(MEMORY_IDS):
        assert texts(store.get_messages(memory_id)) == [f"update {n}", f"append {n}"], memory_id
    for memory_id in MEMORY_IDS[::2]:
        store.delete_messages(memory_id)
    for n, memory_id in enumerate(MEMORY_IDS):
        expected = [] if n % 2 == 0 else [f"update {n}", f"append {n}"]
        assert texts(store.get_messages(memory_id)) == expected, memory_id


def test_the_same_message_ids_in_two_conversations_do_not_interfere(store: Any) -> None:
    shared = [user("x", message_id="same-1"), user("y", message_id="same-2")]
    store.update_messages("one", shared)
    store.update_messages("two", shared)
    store.apply_changes("one", appended=[], removed=["same-1"])
    assert texts(store.get_messages("one")) == ["y"]
    assert texts(store.get_messages("two")) == ["x", "y"]


# -- size ------------------------------------------------------------------------------------


def test_large_conversations(store: Any) -> None:
    msgs = [user(f"message {i} " + "x" * (i % 50)) for i in range(3000)]
    store.update_messages("big", msgs)
    assert dumps(store.get_messages("big")) == dumps(msgs)
    for turn in range(20):
        new = [user(f"turn {turn} q"), AiMessage(f"turn {turn} a", message_id=new_message_id())]
        store.apply_changes("big", appended=new, removed=ids(msgs[:2]))
        msgs = msgs[2:] + new
    assert dumps(store.get_messages("big")) == dumps(msgs)
    store.update_messages("big", msgs[-10:])
    assert dumps(store.get_messages("big")) == dumps(msgs[-10:])


def test_long_text(store: Any) -> None:
    msgs = [user("é" * 1_000_000)]
    store.update_messages("long", msgs)
    assert dumps(store.get_messages("long")) == dumps(msgs)


# -- concurrency -------------------------------------------------------------------------------


def _in_threads(n: int, work: Callable[[int], None]) -> None:
    start = threading.Barrier(n)

    def run(worker: int) -> None:
        start.wait()
        work(worker)

    with ThreadPoolExecutor(n) as pool:
        for future in [pool.submit(run, w) for w in range(n)]:
            future.result()


def test_concurrent_appends_from_threads_lose_nothing(backend: OpenedBackend) -> None:
    stores = [backend.open() for _ in range(2)] if backend.spec.persistent else [backend.open()]
    threads, turns = 8, 25

    def work(worker: int) -> None:
        store = stores[worker % len(stores)]
        for i in range(turns):
            store.apply_changes("shared", appended=[user(f"{worker}:{i}")], removed=[])

    _in_threads(threads, work)
    _assert_interleaved(stores[0].get_messages("shared"), threads, turns)


def test_concurrent_sliding_windows_from_threads_lose_nothing(store: Any) -> None:
    # Each writer keeps its own newest 3 messages, as a window does: append 1, evict 1.
    threads, turns, keep = 6, 30, 3

    def work(worker: int) -> None:
        mine: list[ChatMessage] = []
        for i in range(turns):
            new = user(f"{worker}:{i}")
            mine.append(new)
            removed = [mine.pop(0).message_id] if len(mine) > keep else []
            store.apply_changes("shared", appended=[new], removed=removed)

    _in_threads(threads, work)
    got = texts(store.get_messages("shared"))
    assert len(got) == threads * keep
    for worker in range(threads):
        assert [t for t in got if t and t.split(":")[0] == str(worker)] == [
            f"{worker}:{i}" for i in range(turns - keep, turns)
        ]


def test_concurrent_writers_on_distinct_ids(store: Any) -> None:
    threads, turns = 8, 20

    def work(worker: int) -> None:
        for i in range(turns):
            if i % 5 == 4:
                current = store.get_messages(f"id-{worker}")
                store.update_messages(f"id-{worker}", [*current, user(f"{i}")])
            else:
                store.apply_changes(f"id-{worker}", appended=[user(f"{i}")], removed=[])

    _in_threads(threads, work)
    for worker in range(threads):
        assert texts(store.get_messages(f"id-{worker}")) == [str(i) for i in range(turns)]


def _assert_interleaved(messages: list[ChatMessage], writers: int, turns: int) -> None:
    got = texts(messages)
    assert len(got) == writers * turns
    assert len(set(ids(messages))) == writers * turns
    for writer in range(writers):
        mine = [t for t in got if t and t.split(":")[0] == str(writer)]
        assert mine == [f"{writer}:{i}" for i in range(turns)]


# -- persistence and processes (persistent stores only) -----------------------------------------


def test_a_new_store_object_reads_everything_back(persistent_backend: OpenedBackend) -> None:
    first = persistent_backend.open()
    first.update_messages("c", EVERY_KIND[:4])
    first.apply_changes("c", appended=EVERY_KIND[4:], removed=["m-system"])
    first.update_messages(7, [user("int id")])
    close = getattr(first, "close", None)
    if close is not None:
        close()
    second = persistent_backend.open()
    assert dumps(second.get_messages("c")) == dumps(EVERY_KIND[1:])
    assert texts(second.get_messages(7)) == ["int id"]
    assert second.get_messages("7") == []


def _append_in_process(
    opener: Callable[..., Any], start: Any, memory_id: str, writer: int, turns: int
) -> None:
    store = opener()
    try:
        start.wait(60)  # (a writer that failed to open must not hang the others)
        for i in range(turns):
            store.apply_changes(memory_id, appended=[user(f"{writer}:{i}")], removed=[])
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def test_concurrent_appends_from_processes_lose_nothing(
    persistent_backend: OpenedBackend,
) -> None:
    processes, turns = 4, 50
    in_processes(
        processes, _append_in_process, persistent_backend.opener, "shared", turns, timeout=120
    )
    store = persistent_backend.open()
    _assert_interleaved(store.get_messages("shared"), processes, turns)


# -- history (stores that can keep it) ------------------------------------------------------------


def history_view(entries: list[HistoryEntry]) -> list[tuple[str | None, bool]]:
    return [(getattr(e.message, "text", None), e.evicted) for e in entries]


def test_history_of_an_unknown_id_is_empty(history_store: Any) -> None:
    assert history_store.get_history("nobody") == []
    history_store.forget("nobody")


def test_history_marks_evicted_messages_and_keeps_order(history_store: Any) -> None:
    before = datetime.now(UTC)
    window: list[ChatMessage] = []
    for turn in range(50):
        new = [user(f"q{turn}"), AiMessage(f"a{turn}", message_id=new_message_id())]
        window.extend(new)
        evicted, window = window[:-10], window[-10:]
        history_store.apply_changes("c", appended=new, removed=ids(evicted))
    assert dumps(history_store.get_messages("c")) == dumps(window)
    history = history_store.get_history("c")
    assert len(history) == 100
    expected = [m for t in range(50) for m in (f"q{t}", f"a{t}")]
    assert [getattr(e.message, "text", None) for e in history] == expected
    assert [e.evicted for e in history] == [True] * 90 + [False] * 10
    assert dumps([e.message for e in history[-10:]]) == dumps(window)
    for entry in history[:90]:
        assert entry.evicted_at is not None
        assert before - timedelta(seconds=1) <= entry.evicted_at <= datetime.now(UTC)
    assert all(e.evicted_at is None for e in history[90:])


def test_messages_a_turn_evicts_at_once_reach_history_in_order(history_store: Any) -> None:
    # A turn longer than the window: its first messages leave in the write that brings them.
    memory = MessageWindowChatMemory(2, id="c", store=history_store)
    memory.add(user("before"))
    call = ToolExecutionRequest("t1", "lookup", "{}")
    memory.add(
        user("q"),
        AiMessage(tool_execution_requests=[call]),
        ToolExecutionResultMessage("t1", "lookup", "found"),
        AiMessage("answer"),
    )
    assert texts(memory.messages()) == ["answer"]
    assert history_view(history_store.get_history("c")) == [
        ("before", True),
        ("q", True),
        (None, True),
        ("found", True),
        ("answer", False),
    ]
    memory.add(user("next"))
    assert [e.message.text for e in history_store.get_history("c")][-2:] == ["answer", "next"]


async def test_messages_an_async_turn_evicts_at_once_reach_history(history_store: Any) -> None:
    memory = MessageWindowChatMemory(1, id="c", store=history_store)
    try:
        await memory.aadd(user("q"), AiMessage("a"))
        assert texts(await memory.amessages()) == ["a"]
        history = await history_store.aget_history("c")
        assert history_view(history) == [("q", True), ("a", False)]
    finally:
        close = getattr(history_store, "aclose", None)
        if close is not None:
            await close()  # the async clients belong to this test's event loop


def test_a_history_only_message_whose_id_is_stored_is_a_duplicate(history_store: Any) -> None:
    kept = user("kept")
    history_store.apply_changes("c", appended=[kept], removed=[])
    twin = user("twin", message_id=kept.message_id)
    with pytest.raises(ValueError, match="appears twice"):
        history_store.apply_changes("c", appended=[user("new")], removed=[], history_only=[twin])
    assert history_view(history_store.get_history("c")) == [("kept", False)]


def test_a_history_only_message_whose_id_is_appended_is_a_duplicate(history_store: Any) -> None:
    kept = user("kept")
    history_store.apply_changes("c", appended=[kept], removed=[])
    passing, twin = user("passing", message_id="7"), user("twin", message_id="7")
    with pytest.raises(ValueError, match="'7' appears twice"):
        history_store.apply_changes("c", appended=[twin], removed=[], history_only=[passing])
    assert history_view(history_store.get_history("c")) == [("kept", False)]


def test_messages_a_turn_evicts_at_once_are_not_stored_without_history(
    backend: OpenedBackend,
) -> None:
    store = backend.open()
    memory = MessageWindowChatMemory(1, id="c", store=store)
    memory.add(user("q"), AiMessage("a"))
    assert texts(store.get_messages("c")) == ["a"]
    if backend.spec.history:
        assert history_view(store.get_history("c")) == [("a", False)]


def test_history_keeps_metadata(history_store: Any) -> None:
    history_store.update_messages("c", EVERY_KIND)
    history_store.apply_changes("c", appended=[], removed=["m-user", "m-ai-tools"])
    history = history_store.get_history("c")
    assert dumps([e.message for e in history]) == dumps(EVERY_KIND)
    assert [e.evicted for e in history] == [False, True, True, False, False, False, False, False]


def test_update_messages_moves_what_it_drops_to_history(history_store: Any) -> None:
    old = [user(f"{i}") for i in range(4)]
    history_store.update_messages("c", old)
    history_store.update_messages("c", [old[2], old[3], user("4")])
    assert texts(history_store.get_messages("c")) == ["2", "3", "4"]
    assert history_view(history_store.get_history("c")) == [
        ("0", True),
        ("1", True),
        ("2", False),
        ("3", False),
        ("4", False),
    ]


def test_delete_messages_with_history_empties_the_window_only(history_store: Any) -> None:
    history_store.update_messages("c", [user("a"), user("b")])
    history_store.delete_messages("c")
    assert history_store.get_messages("c") == []
    assert history_view(history_store.get_history("c")) == [("a", True), ("b", True)]
    history_store.apply_changes("c", appended=[user("c")], removed=[])
    assert history_view(history_store.get_history("c")) == [("a", True), ("b", True), ("c", False)]


def test_forget_erases_window_and_history(history_store: Any) -> None:
    history_store.update_messages("c", [user("a"), user("b")])
    history_store.apply_changes("c", appended=[user("c")], removed=[])
    history_store.delete_messages("c")
    history_store.update_messages("other", [user("stays")])
    history_store.forget("c")
    assert history_store.get_messages("c") == []
    assert history_store.get_history("c") == []
    assert texts(history_store.get_messages("other")) == ["stays"]
    history_store.apply_changes("c", appended=[user("fresh")], removed=[])
    assert history_view(history_store.get_history("c")) == [("fresh", False)]


def test_forget_works_without_history(backend: OpenedBackend) -> None:
    store = backend.open()
    forget = getattr(store, "forget", None)
    if forget is None:
        pytest.skip(f"{backend.name} has no forget()")
    store.update_messages("c", [user("a")])
    forget("c")
    assert store.get_messages("c") == []


# -- against a model -----------------------------------------------------------------------------

_text = st.text(max_size=12)
_contents = st.one_of(
    st.builds(SystemMessage, _text),
    st.builds(UserMessage, _text, st.none() | _text),
    st.builds(
        AiMessage,
        st.none() | _text,
        st.lists(st.builds(ToolExecutionRequest, _text, _text, _text), max_size=2),
    ),
    st.builds(ToolExecutionResultMessage, _text, _text, _text),
)
_apply = st.tuples(
    st.just("apply"),
    st.lists(_contents, max_size=3),
    st.lists(st.integers(0, 40), max_size=4),
    st.booleans(),
)
_update = st.tuples(
    st.just("update"),
    st.lists(_contents, max_size=3),
    st.lists(st.integers(0, 40), max_size=12),
    st.booleans(),
)
_delete = st.tuples(st.just("delete"), st.just([]), st.just([]), st.just(False))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(operations=st.lists(st.one_of(_apply, _apply, _update, _delete), max_size=12))
def test_store_behaves_like_a_list(
    store: Any, operations: list[tuple[str, list[ChatMessage], list[int], bool]]
) -> None:
    memory_id = f"model-{uuid.uuid4().hex}"
    model: list[ChatMessage] = []
    for kind, contents, picks, flag in operations:
        if kind == "apply":
            new = [m.with_metadata(message_id=new_message_id()) for m in contents]
            removed = {model[p % len(model)].message_id for p in picks} if model else set()
            if flag:
                removed.add("unknown-id")
            store.apply_changes(memory_id, appended=new, removed=removed)
            model = [m for m in model if m.message_id not in removed] + new
        elif kind == "update":
            kept = list(dict.fromkeys(model[p % len(model)].message_id for p in picks if model))
            by_id = {m.message_id: m for m in model}
            wanted = [by_id[i] for i in kept]
            # flag: the new messages come without ids, and go first rather than last
            new = (
                contents
                if flag
                else [m.with_metadata(message_id=new_message_id()) for m in contents]
            )
            wanted = [*new, *wanted] if flag else [*wanted, *new]
            store.update_messages(memory_id, wanted)
            model = wanted
        else:
            store.delete_messages(memory_id)
            model = []
        got = store.get_messages(memory_id)
        assert got == model
        assert all(m.message_id for m in got)
        assert [m.model_dump(exclude={"message_id"}) for m in got] == [
            m.model_dump(exclude={"message_id"}) for m in model
        ]
        assert ids(got) == [
            g if m.message_id is None else m.message_id
            for m, g in zip(model, ids(got), strict=True)
        ]
        model = got


# -- listing conversations ----------------------------------------------------------------


def test_memory_ids_lists_each_conversation_with_its_id_as_given(backend: OpenedBackend) -> None:
    store = backend.open(keep_history=True) if backend.spec.history else backend.open()
    ids: list[Hashable] = [
        "alice",
        7,
        True,
        1.5,
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "\x1fstarts with the separator",
        "7",
        "",
    ]
    for memory_id in ids:
        store.update_messages(memory_id, [UserMessage(f"from {memory_id!r}")])
    listed = list(store.memory_ids())
    assert sorted(map(repr, listed)) == sorted(map(repr, ids))
    for memory_id in listed:  # each one reads its own conversation back
        assert [m.text for m in store.get_messages(memory_id)] == [f"from {memory_id!r}"]
    store.forget(7) if backend.spec.history else store.delete_messages(7)
    assert 7 not in list(store.memory_ids())


def test_memory_ids_gives_back_ids_of_other_common_types_as_given(
    backend: OpenedBackend,
) -> None:
    store = backend.open()
    ids: list[Hashable] = [
        None,
        Decimal("1.50"),
        ("tenant", 42, None, (1.5, "x")),
        date(2026, 1, 2),
        datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5),
    ]
    for memory_id in ids:
        store.update_messages(memory_id, [UserMessage(f"from {memory_id!r}")])
    listed = list(store.memory_ids())
    assert sorted(map(repr, listed)) == sorted(map(repr, ids))
    for memory_id in listed:
        assert [m.text for m in store.get_messages(memory_id)] == [f"from {memory_id!r}"]
    # What no literal spells comes back as the text it was filed under.
    store.update_messages(frozenset({1}), [UserMessage("set")])
    assert "frozenset({1})" in list(store.memory_ids())


def test_a_conversation_whose_messages_were_all_removed_is_not_listed(
    backend: OpenedBackend,
) -> None:
    store = backend.open()
    a = user("a")
    store.apply_changes(1, appended=[a], removed=[])
    store.apply_changes("kept", appended=[user("b")], removed=[])
    store.apply_changes(1, appended=[], removed=[a.message_id])
    assert store.get_messages(1) == []
    assert list(store.memory_ids()) == ["kept"]


def test_memory_ids_of_an_empty_store_is_empty(backend: OpenedBackend) -> None:
    assert list(backend.open().memory_ids()) == []


def test_retention_deletes_conversations_untouched_for_longer(backend: OpenedBackend) -> None:
    import time

    store = backend.open(retention=timedelta(seconds=1))
    store.apply_changes("old", appended=[user("left alone")], removed=[])
    time.sleep(1.3)
    # The next write that starts a conversation purges (Redis: the keys expired by then).
    store.apply_changes("new", appended=[user("just now")], removed=[])
    time.sleep(0.05)
    store.apply_changes("newer", appended=[user("and now")], removed=[])
    assert store.get_messages("old") == []
    assert texts(store.get_messages("new")) == ["just now"]
    assert sorted(map(str, store.memory_ids())) == ["new", "newer"]


def test_retention_must_be_a_positive_period(backend: OpenedBackend) -> None:
    with pytest.raises(TypeError, match="timedelta"):
        backend.open(retention=3600)
    with pytest.raises(ValueError, match="positive"):
        backend.open(retention=timedelta(0))
