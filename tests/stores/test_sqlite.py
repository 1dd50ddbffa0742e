"""SqliteChatMemoryStore beyond the contract: schema, corrupt rows, locking, connections."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aiservices import MessageWindowChatMemory
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    UserMessage,
    message_from_json,
    message_to_json,
    new_message_id,
)
from aiservices.stores import (
    ChatHistoryStore,
    CorruptMessageError,
    IncrementalChatMemoryStore,
    SqliteChatMemoryStore,
    StoreSchemaError,
)
from aiservices.stores._common import MessageCache

from ._messages import texts, user


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "chat.db"


@pytest.fixture
def store(path: Path) -> Iterator[SqliteChatMemoryStore]:
    with SqliteChatMemoryStore(path) as store:
        yield store


@pytest.fixture
def raw(path: Path, store: SqliteChatMemoryStore) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(path, isolation_level=None)
    yield conn
    conn.close()


def test_it_is_an_incremental_history_store_that_blocks(store: SqliteChatMemoryStore) -> None:
    assert isinstance(store, IncrementalChatMemoryStore)
    assert isinstance(store, ChatHistoryStore)
    assert store.is_blocking is True
    assert "chat.db" in repr(store)


# -- schema ----------------------------------------------------------------------------------


def test_the_file_is_in_wal_mode_with_a_versioned_schema(raw: sqlite3.Connection) -> None:
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert raw.execute("SELECT value FROM chat_messages_schema WHERE name = 'version'").fetchone()
    tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
    assert {"chat_messages", "chat_messages_history", "chat_messages_schema"} <= tables


def test_reads_and_removals_use_an_index(raw: sqlite3.Connection) -> None:
    read = raw.execute(
        "EXPLAIN QUERY PLAN SELECT seq, message FROM chat_messages WHERE memory_key = ? "
        "ORDER BY seq",
        ("x",),
    ).fetchall()
    assert "USING PRIMARY KEY (memory_key=?)" in str(read)
    assert "TEMP B-TREE" not in str(read)
    remove = raw.execute(
        "EXPLAIN QUERY PLAN DELETE FROM chat_messages WHERE memory_key = ? AND message_id = ?",
        ("x", "y"),
    ).fetchall()
    assert "chat_messages_message_id (memory_key=? AND message_id=?)" in str(remove)


def test_rows_carry_their_metadata_in_columns(
    store: SqliteChatMemoryStore, raw: sqlite3.Connection
) -> None:
    message = UserMessage("hi", message_id="m1", turn_id="t1")
    store.apply_changes(("k", 1), appended=[message], removed=[])
    row = raw.execute(
        "SELECT memory_key, seq, message_id, turn_id, created_at, message FROM chat_messages"
    ).fetchone()
    assert row[0] == "\x1ftuple:('k', 1)"
    assert row[2:5] == ("m1", "t1", None)
    assert '"text":"hi"' in row[5]


def test_a_newer_schema_is_refused_with_a_clear_error(
    store: SqliteChatMemoryStore, raw: sqlite3.Connection, path: Path
) -> None:
    raw.execute("UPDATE chat_messages_schema SET value = '99' WHERE name = 'version'")
    with pytest.raises(StoreSchemaError, match=r"schema version 99, newer .*upgrade aiservices"):
        SqliteChatMemoryStore(path)


def test_a_table_it_did_not_make_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE chat_messages (id INTEGER)")
    conn.close()
    with pytest.raises(StoreSchemaError, match=r"not made by aiservices; pass another table="):
        SqliteChatMemoryStore(path)
    with SqliteChatMemoryStore(path, table="my_chats") as store:
        store.update_messages("a", [user("fine")])
        assert texts(store.get_messages("a")) == ["fine"]


def test_two_tables_in_one_file_are_independent(path: Path) -> None:
    with (
        SqliteChatMemoryStore(path, table="one") as one,
        SqliteChatMemoryStore(path, table="two") as two,
    ):
        one.update_messages("a", [user("in one")])
        two.update_messages("a", [user("in two")])
        assert texts(one.get_messages("a")) == ["in one"]
        assert texts(two.get_messages("a")) == ["in two"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": ":memory:"}, "needs a file path.*InMemoryChatMemoryStore"),
        ({"path": ""}, "needs a file path"),
        ({"table": "chat messages"}, "plain SQL identifier"),
        ({"table": "x; DROP TABLE y"}, "plain SQL identifier"),
        ({"timeout": -1}, "timeout must be a finite number of seconds >= 0, got -1"),
        ({"timeout": float("nan")}, "timeout must be a finite number of seconds >= 0, got nan"),
        ({"timeout": float("inf")}, "timeout must be a finite number of seconds >= 0, got inf"),
        ({"synchronous": "SOMETIMES"}, "synchronous must be one of"),
    ],
)
def test_bad_arguments_are_clear_errors(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    options: dict[str, object] = {"path": tmp_path / "x.db", **kwargs}
    with pytest.raises(ValueError, match=message):
        SqliteChatMemoryStore(**options)


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        ("5", r"timeout must be a finite number of seconds >= 0, not str '5'; pass it as a "
         r"number: timeout=5\.0"),
        (None, "timeout must be a finite number of seconds >= 0, not NoneType None"),
        (True, "timeout must be a finite number of seconds >= 0, not bool True"),
    ],
)  # fmt: skip
def test_a_timeout_that_is_not_a_number_is_a_type_error(
    tmp_path: Path, timeout: object, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        SqliteChatMemoryStore(tmp_path / "x.db", timeout=timeout)  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()  # refused before the file is made


def test_a_timeout_of_zero_is_allowed(tmp_path: Path) -> None:
    with SqliteChatMemoryStore(tmp_path / "x.db", timeout=0) as store:
        store.update_messages("c", [user("a")])
        assert texts(store.get_messages("c")) == ["a"]


def test_synchronous_is_applied(path: Path) -> None:
    with SqliteChatMemoryStore(path, synchronous="FULL") as store:
        assert store._connection().execute("PRAGMA synchronous").fetchone() == (2,)


# -- writes only what changed ---------------------------------------------------------------


@pytest.fixture
def row_writes(raw: sqlite3.Connection) -> Callable[[], int]:
    """How many rows any connection has inserted into or deleted from the window table."""
    raw.executescript(
        """
        CREATE TABLE writes (n INTEGER NOT NULL);
        INSERT INTO writes VALUES (0);
        CREATE TRIGGER count_inserts AFTER INSERT ON chat_messages
            BEGIN UPDATE writes SET n = n + 1; END;
        CREATE TRIGGER count_deletes AFTER DELETE ON chat_messages
            BEGIN UPDATE writes SET n = n + 1; END;
        """
    )
    return lambda: int(raw.execute("SELECT n FROM writes").fetchone()[0])


def test_a_turn_writes_only_its_rows_whatever_the_window(
    store: SqliteChatMemoryStore, row_writes: Callable[[], int]
) -> None:
    window = [user(str(i)) for i in range(1000)]
    store.update_messages("c", window)
    before = row_writes()
    new = [user("q"), AiMessage("a", message_id=new_message_id())]
    store.apply_changes("c", appended=new, removed=[window[0].message_id, window[1].message_id])
    assert row_writes() - before == 4


def test_update_messages_writes_the_difference(
    store: SqliteChatMemoryStore, row_writes: Callable[[], int]
) -> None:
    sys = SystemMessage("pinned", message_id=new_message_id())
    window: list[ChatMessage] = [sys, *(user(str(i)) for i in range(500))]
    store.update_messages("c", window)
    before = row_writes()
    window = [sys, *window[3:], user("new 1"), user("new 2")]
    store.update_messages("c", window)
    assert row_writes() - before == 2 + 2
    before = row_writes()
    store.update_messages("c", window)
    assert row_writes() == before
    window = [window[1], window[0], *window[2:]]
    store.update_messages("c", window)  # the order changes: the window is written again
    assert texts(store.get_messages("c"))[:2] == ["2", "pinned"]


def _numbers(raw: sqlite3.Connection, table: str = "chat_messages") -> dict[str, int]:
    """Each row's sequence number, by the text of its message."""
    rows = raw.execute(f"SELECT seq, message FROM {table} ORDER BY seq").fetchall()
    return {str(getattr(message_from_json(text), "text", None)): seq for seq, text in rows}


def test_the_newest_number_stays_held_when_its_row_is_removed(
    store: SqliteChatMemoryStore, raw: sqlite3.Connection
) -> None:
    # A write that removes the newest rows and adds none moves the highest row left up to
    # the number they had, so that the next write numbers after every number given.
    a, b, c, d = user("a"), user("b"), user("c"), user("d")
    store.apply_changes("k", appended=[a, b, c], removed=[])
    first = _numbers(raw)
    store.apply_changes("k", appended=[], removed=[a.message_id])  # not the newest: kept
    assert _numbers(raw) == {"b": first["b"], "c": first["c"]}
    store.apply_changes("k", appended=[], removed=[c.message_id])  # the newest
    assert _numbers(raw) == {"b": first["c"]}
    store.apply_changes("k", appended=[c], removed=[])
    assert _numbers(raw) == {"b": first["c"], "c": first["c"] + 1}
    store.update_messages("k", [c])  # update_messages removing the oldest: kept
    assert _numbers(raw) == {"c": first["c"] + 1}
    store.update_messages("k", [c, d])
    store.update_messages("k", [c])  # and the newest
    assert _numbers(raw) == {"c": first["c"] + 2}
    store.update_messages("k", [c, d])
    assert _numbers(raw) == {"c": first["c"] + 2, "d": first["c"] + 3}
    assert texts(store.get_messages("k")) == ["c", "d"]


def test_a_turn_renumbers_nothing(store: SqliteChatMemoryStore, raw: sqlite3.Connection) -> None:
    raw.executescript(
        """
        CREATE TABLE updates (n INTEGER NOT NULL);
        INSERT INTO updates VALUES (0);
        CREATE TRIGGER count_updates AFTER UPDATE ON chat_messages
            BEGIN UPDATE updates SET n = n + 1; END;
        """
    )
    memory = MessageWindowChatMemory(4, id="k", store=store)
    for i in range(10):
        memory.add(UserMessage(f"q{i}"), AiMessage(f"a{i}"))
    assert texts(memory.messages()) == ["q8", "a8", "q9", "a9"]
    assert raw.execute("SELECT n FROM updates").fetchone() == (0,)


def test_clearing_the_window_beside_older_history_keeps_its_last_number(path: Path) -> None:
    a, b = user("a"), user("b")
    with SqliteChatMemoryStore(path, keep_history=True) as keeping:
        keeping.apply_changes("x", appended=[a, b], removed=[])
        keeping.apply_changes("x", appended=[], removed=[a.message_id])
    with SqliteChatMemoryStore(path) as plain, sqlite3.connect(path) as raw:
        top = _numbers(raw)["b"]
        plain.delete_messages("x")  # the history holds a lower number: it moves up
        assert _numbers(raw, "chat_messages_history") == {"a": top}
        plain.apply_changes("x", appended=[b], removed=[])
        assert _numbers(raw) == {"b": top + 1}
        assert [e.message for e in plain.get_history("x")] == [a, b]
    raw.close()


def test_a_file_written_by_the_previous_version_is_used_as_it_is(path: Path) -> None:
    # The numbering needs no change of schema: a file of version 1 is read and written, and
    # stays version 1, so processes of either version share it.
    with SqliteChatMemoryStore(path) as store:
        store.update_messages("c", [user("a"), user("b")])
    with sqlite3.connect(path) as raw:
        tables = raw.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
        assert sorted(tables) == [
            ("chat_messages",),
            ("chat_messages_history",),
            ("chat_messages_schema",),
        ]
        version = raw.execute("SELECT value FROM chat_messages_schema WHERE name = 'version'")
        assert version.fetchone() == ("1",)
    raw.close()


def test_a_rewrite_keeps_each_message_once_in_history(path: Path) -> None:
    with SqliteChatMemoryStore(path, keep_history=True) as store:
        a, b, c = user("a"), user("b"), user("c")
        store.update_messages("x", [a, b, c])
        store.update_messages("x", [SystemMessage("first", message_id="s"), c, b])
        history = [(getattr(e.message, "text", None), e.evicted) for e in store.get_history("x")]
        assert history == [("a", True), ("first", False), ("c", False), ("b", False)]


def test_history_written_earlier_is_read_without_keep_history(path: Path) -> None:
    a, b = user("a"), user("b")
    with SqliteChatMemoryStore(path, keep_history=True) as keeping:
        keeping.apply_changes("x", appended=[a, b], removed=[])
        keeping.apply_changes("x", appended=[], removed=[a.message_id])
    with SqliteChatMemoryStore(path) as plain:
        plain.apply_changes("x", appended=[], removed=[b.message_id])
        assert [e.message for e in plain.get_history("x")] == [a]
        plain.forget("x")
        assert plain.get_history("x") == []


# -- corrupt rows ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param('{"type": "user", "text": ', id="truncated"),
        pytest.param('{"type": "robot", "text": "beep"}', id="unknown-type"),
        pytest.param('{"type": "user", "text": 5}', id="wrong-field-type"),
        pytest.param("", id="empty"),
        pytest.param('{"type":"user","text":"a"},{"type":"user","text":"b"}', id="two-in-one"),
        pytest.param(b'\xff{"type":"user"}', id="blob"),
        pytest.param(42, id="number"),
    ],
)
def test_a_corrupt_row_is_reported_with_the_memory_id_and_row(
    store: SqliteChatMemoryStore, raw: sqlite3.Connection, bad: object
) -> None:
    store.update_messages("alice", [user("one"), user("two"), user("three")])
    store.update_messages("bob", [user("fine")])
    (seq,) = raw.execute(
        "SELECT seq FROM chat_messages WHERE memory_key = 'alice' ORDER BY seq LIMIT 1 OFFSET 1"
    ).fetchone()
    raw.execute(
        "UPDATE chat_messages SET message = ? WHERE memory_key = 'alice' AND seq = ?", (bad, seq)
    )
    with pytest.raises(CorruptMessageError) as caught:
        store.get_messages("alice")
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.memory_id == "alice"
    assert error.row == seq
    assert "'alice'" in str(error)
    assert f"seq = {seq}" in str(error)
    with pytest.raises(CorruptMessageError):
        store.get_history("alice")
    assert texts(store.get_messages("bob")) == ["fine"]
    # Writes still work, so the bad row can be removed through the store.
    store.delete_messages("alice")
    assert store.get_messages("alice") == []


def test_a_corrupt_eviction_mark_is_reported(path: Path) -> None:
    with SqliteChatMemoryStore(path, keep_history=True) as store:
        a = user("a")
        store.apply_changes("x", appended=[a, user("b")], removed=[])
        store.apply_changes("x", appended=[], removed=[a.message_id])
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE chat_messages_history SET evicted_at = 'yesterday'")
        conn.close()
        with pytest.raises(CorruptMessageError, match="evicted_at 'yesterday'"):
            store.get_history("x")


# -- parsed messages are cached by their text --------------------------------------------------


def test_a_window_read_again_is_not_parsed_again(store: SqliteChatMemoryStore) -> None:
    store.update_messages("c", [user("a"), user("b")])
    first, second = store.get_messages("c"), store.get_messages("c")
    assert first == second
    assert all(x is y for x, y in zip(first, second, strict=True))


def test_rows_another_writer_changed_are_read_fresh(
    store: SqliteChatMemoryStore, raw: sqlite3.Connection
) -> None:
    a = user("a")
    store.update_messages("c", [a])
    assert texts(store.get_messages("c")) == ["a"]
    changed = UserMessage("changed", message_id=a.message_id, turn_id="t")
    raw.execute("UPDATE chat_messages SET message = ?", (message_to_json(changed),))
    assert [m.model_dump() for m in store.get_messages("c")] == [changed.model_dump()]


def test_the_cache_stays_bounded_and_right() -> None:
    cache = MessageCache(max_entries=4, max_chars=10_000)
    messages = [user(f"m{i}") for i in range(20)]
    json_texts = [message_to_json(m) for m in messages]

    def corrupt(i: int, why: str) -> Exception:
        return ValueError(i, why)

    for _ in range(2):
        for start in range(0, 20, 3):
            got = cache.parse(json_texts[start : start + 3], corrupt)
            assert got == messages[start : start + 3]
            assert len(cache._young) + len(cache._old) <= 8
    small = MessageCache(max_entries=1_000, max_chars=len(json_texts[0]) * 2)
    small.parse(json_texts, corrupt)
    assert len(small._young) + len(small._old) <= 4
    with pytest.raises(ValueError, match="invalid chat message") as caught:
        cache.parse([json_texts[0], "{}", json_texts[1]], corrupt)
    assert caught.value.args[0] == 1


# -- locking and connections -----------------------------------------------------------------------


def test_readers_do_not_wait_for_a_writer(
    store: SqliteChatMemoryStore, raw: sqlite3.Connection
) -> None:
    store.update_messages("c", [user("committed")])
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("DELETE FROM chat_messages")
    assert texts(store.get_messages("c")) == ["committed"]
    raw.execute("ROLLBACK")


def test_a_writer_waits_its_timeout_then_raises_sqlites_error(path: Path) -> None:
    with SqliteChatMemoryStore(path, timeout=0.05) as store:
        store.update_messages("c", [user("kept")])
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                store.apply_changes("c", appended=[user("lost?")], removed=[])
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert texts(store.get_messages("c")) == ["kept"]
        store.apply_changes("c", appended=[user("now")], removed=[])
        assert texts(store.get_messages("c")) == ["kept", "now"]


def test_a_failed_write_changes_nothing(store: SqliteChatMemoryStore) -> None:
    a = user("a")
    store.update_messages("c", [a, user("b")])
    with pytest.raises(ValueError, match="appears twice"):
        store.apply_changes("c", appended=[user("c"), a], removed=[])
    assert texts(store.get_messages("c")) == ["a", "b"]


def test_each_thread_has_its_own_connection_closed_when_the_thread_ends(
    store: SqliteChatMemoryStore,
) -> None:
    store.update_messages("c", [user("x")])
    seen: list[sqlite3.Connection] = []

    def read() -> None:
        store.get_messages("c")
        seen.append(store._connection())

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in seen}) == 3
    assert store._connection() not in seen
    del threads
    gc.collect()
    for conn in seen:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")


def test_close_closes_every_connection(path: Path) -> None:
    store = SqliteChatMemoryStore(path)
    worker_conn: list[sqlite3.Connection] = []
    barrier = threading.Barrier(2)

    def hold() -> None:
        worker_conn.append(store._connection())
        barrier.wait()
        barrier.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    barrier.wait()
    store.close()
    barrier.wait()
    thread.join()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        worker_conn[0].execute("SELECT 1")
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        store.get_messages("c")


def _use_inherited_store(store: SqliteChatMemoryStore) -> None:
    store.apply_changes("c", appended=[user("from the child")], removed=[])


def test_a_store_used_before_fork_works_in_the_child(store: SqliteChatMemoryStore) -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("this platform cannot fork")
    store.apply_changes("c", appended=[user("from the parent")], removed=[])
    child = multiprocessing.get_context("fork").Process(target=_use_inherited_store, args=(store,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    store.apply_changes("c", appended=[user("parent again")], removed=[])
    assert texts(store.get_messages("c")) == ["from the parent", "from the child", "parent again"]


def test_a_relative_path_stays_the_same_file_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    store = SqliteChatMemoryStore("chat.db")
    store.update_messages("c", [user("hi")])
    monkeypatch.chdir(second)
    found: list[list[str]] = []
    # A thread opens its own connection: by the path the store was made with.
    reader = threading.Thread(target=lambda: found.append(texts(store.get_messages("c"))))
    reader.start()
    reader.join()
    assert found == [["hi"]]
    assert not (second / "chat.db").exists()
    store.close()


def test_a_file_system_mounted_read_only_is_named_as_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiservices.stores import sqlite as module

    path = tmp_path / "c.db"
    SqliteChatMemoryStore(path).close()
    path.chmod(0o444)
    # Mounting needs privileges a test does not have: the mount's flag is what is faked.
    monkeypatch.setattr(module, "_read_only_mount", lambda folder: folder == str(tmp_path))
    error = module._open_error(str(path), None)
    assert "mounted read-only" in str(error)
    assert "change its permissions" not in str(error)


def test_writers_queued_behind_another_process_each_wait_one_timeout(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SqliteChatMemoryStore(path, timeout=1.0)
    other = sqlite3.connect(path, isolation_level=None)  # as another process's write would
    other.execute("BEGIN IMMEDIATE")
    waited: list[float] = []
    errors: list[str] = []

    def write(i: int) -> None:
        started = time.monotonic()
        try:
            store.apply_changes(f"user{i}", appended=[user("hi")], removed=[])
        except sqlite3.OperationalError as exc:
            errors.append(str(exc))
        waited.append(time.monotonic() - started)

    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    other.rollback()
    other.close()
    assert len(errors) == 4
    assert all("database is locked" in error for error in errors)
    # One timeout each, not one more for every writer queued ahead (4 s for the last).
    assert max(waited) < 2.0
    store.close()


async def test_async_reads_do_not_queue_behind_writes_waiting_on_a_lock(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SqliteChatMemoryStore(path, timeout=2.0)
    store.update_messages("other", [user("readable")])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        writes = [
            asyncio.ensure_future(store.aapply_changes(f"u{i}", appended=[user("x")], removed=[]))
            for i in range(2)
        ]
        await asyncio.sleep(0.2)  # the writes are queued, the first waiting on the lock
        started = time.monotonic()
        assert texts(await store.aget_messages("other")) == ["readable"]
        assert time.monotonic() - started < 1.0  # not after the writes' 2 s waits
    finally:
        holder.rollback()
        holder.close()
    await asyncio.gather(*writes)
    assert texts(store.get_messages("u1")) == ["x"]
    await store.aclose()


async def test_async_writes_queued_behind_a_lock_each_wait_one_timeout(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SqliteChatMemoryStore(path, timeout=1.0)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    try:
        results = await asyncio.gather(
            *(store.aapply_changes(f"u{i}", appended=[user("x")], removed=[]) for i in range(3)),
            return_exceptions=True,
        )
    finally:
        holder.rollback()
        holder.close()
    assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
    # Each timeout counts from when its call was queued, not from when the thread took it.
    assert time.monotonic() - started < 2.0
    await store.aclose()


@pytest.mark.parametrize("replaced", [False, True], ids=["deleted", "replaced"])
def test_a_database_file_deleted_or_replaced_takes_no_more_writes(
    tmp_path: Path, replaced: bool
) -> None:
    path = tmp_path / "c.db"
    store = SqliteChatMemoryStore(path)
    store.update_messages("c", [user("before")])
    path.unlink()
    if replaced:
        SqliteChatMemoryStore(path).close()
    with pytest.raises(sqlite3.OperationalError, match="was deleted or replaced"):
        store.apply_changes("c", appended=[user("lost")], removed=[])
    # A thread opening its own connection neither makes another file nor writes to it.
    errors: list[BaseException] = []

    def write() -> None:
        try:
            store.apply_changes("c", appended=[user("lost too")], removed=[])
        except sqlite3.OperationalError as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join()
    assert len(errors) == 1
    assert path.exists() == replaced
    store.close()


@pytest.mark.parametrize("replaced", [False, True], ids=["deleted", "replaced"])
def test_a_turn_on_a_deleted_or_replaced_file_fails_before_the_model_is_called(
    tmp_path: Path, replaced: bool
) -> None:
    from typing import Annotated, Protocol

    from aiservices import MemoryId, ai_service
    from aiservices.testing import ScriptedChatModel

    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    path = tmp_path / "c.db"
    store = SqliteChatMemoryStore(path)
    model = ScriptedChatModel(default="answer")
    bot = ai_service(
        Bot, model=model, chat_memory_provider=MessageWindowChatMemory.provider(10, store=store)
    )
    bot.chat("alice", "q1")
    path.unlink()
    if replaced:
        SqliteChatMemoryStore(path).close()
    for question in ("q2", "q3"):
        with pytest.raises(sqlite3.OperationalError, match="was deleted or replaced"):
            bot.chat("alice", question)
    # The model is not paid for turns that could never be recorded.
    assert len(model.requests) == 1
    with pytest.raises(sqlite3.OperationalError, match="was deleted or replaced"):
        store.get_messages("alice")
    store.close()


def _open_new_file(path: str, start: Any, results: Any) -> None:
    start.wait(30)
    try:
        SqliteChatMemoryStore(path).close()
        results.put("ok")
    except Exception as exc:
        results.put(repr(exc))


def test_a_file_another_process_creates_as_it_is_opened_is_not_taken_for_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file appears between the store's look at it and its check of the permissions, as
    # when another process opens the same new file at that moment.
    path = tmp_path / "new.db"
    access = os.access

    def racing_access(target: Any, mode: int) -> bool:
        allowed = access(target, mode)
        if os.fspath(target) == str(path) and not path.exists():
            sqlite3.connect(path).close()  # the other process
        return allowed

    monkeypatch.setattr(os, "access", racing_access)
    with SqliteChatMemoryStore(path) as store:
        store.update_messages("c", [user("a")])
        assert texts(store.get_messages("c")) == ["a"]


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # All but one of them are told "database is locked" at once while the file turns to WAL.
    context = multiprocessing.get_context("fork")
    for trial in range(12):
        path = str(tmp_path / f"new-{trial}.db")
        start, results = context.Barrier(6), context.Queue()
        workers = [
            context.Process(target=_open_new_file, args=(path, start, results)) for _ in range(6)
        ]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(30)
        assert outcomes == ["ok"] * 6, outcomes
