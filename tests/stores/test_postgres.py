"""PostgresChatMemoryStore beyond the contract: schema, rows a write touches, locks, pools."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    UserMessage,
    new_message_id,
)
from aiservices.stores import (
    AsyncChatMemoryStore,
    ChatHistoryStore,
    CorruptMessageError,
    IncrementalChatMemoryStore,
    StoreSchemaError,
)
from aiservices.stores.postgres import SCHEMA_VERSION, PostgresChatMemoryStore

from ._messages import texts, user
from ._server_backends import drop_postgres_tables, require_postgres


@pytest.fixture
def dsn() -> str:
    return require_postgres()


@pytest.fixture
def table(dsn: str) -> Iterator[str]:
    table = f"t_{uuid.uuid4().hex}"
    yield table
    drop_postgres_tables(dsn, table)


@pytest.fixture
def store(dsn: str, table: str) -> Iterator[PostgresChatMemoryStore]:
    with PostgresChatMemoryStore(dsn, table=table) as store:
        yield store


@pytest.fixture
def raw(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def test_it_is_an_incremental_async_history_store(store: PostgresChatMemoryStore) -> None:
    assert isinstance(store, IncrementalChatMemoryStore)
    assert isinstance(store, ChatHistoryStore)
    assert isinstance(store, AsyncChatMemoryStore)
    assert getattr(store, "is_blocking", True) is not False


def test_repr_hides_the_password(table: str) -> None:
    store = PostgresChatMemoryStore("host=db user=app password=s3cret dbname=x", table=table)
    assert "s3cret" not in repr(store)
    assert "host=db" in repr(store)
    store.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"dsn_or_pool": 42}, TypeError, "connection string, a psycopg_pool.ConnectionPool"),
        ({"table": ""}, ValueError, "non-empty str"),
        ({"table": "x" * 50}, ValueError, "too long"),
        ({"max_connections": 0}, ValueError, "max_connections must be at least 1"),
        (
            {"max_connections": "3"},
            TypeError,
            "max_connections must be a whole number >= 1, not str",
        ),
        ({"max_connections": 2.5}, TypeError, "max_connections must be a whole number"),
        ({"max_connections": True}, TypeError, "max_connections must be a whole number"),
        ({"timeout": 0}, ValueError, "timeout must be a finite number of seconds > 0, got 0"),
        (
            {"timeout": "5"},
            TypeError,
            r"timeout must be .*, not str '5'; pass it as a number: timeout=5\.0",
        ),
        (
            {"timeout": None},
            TypeError,
            "timeout must be a finite number of seconds > 0, not NoneType",
        ),
        ({"timeout": float("nan")}, ValueError, "timeout must be a finite number .*, got nan"),
        ({"timeout": float("inf")}, ValueError, "timeout must be a finite number .*, got inf"),
        ({"connect_timeout": "5"}, TypeError, "connect_timeout must be a finite number of seconds"),
        ({"statement_timeout": float("nan")}, ValueError, "statement_timeout must be .* or None"),
        ({"lock_timeout": "1"}, TypeError, r"lock_timeout must be .*, or None \(the server's own"),
    ],
)
def test_bad_arguments_are_clear_errors(
    dsn: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    options: dict[str, Any] = {"dsn_or_pool": dsn, **kwargs}
    with pytest.raises(error, match=message):
        PostgresChatMemoryStore(**options)


# -- schema ------------------------------------------------------------------------------------


def test_tables_are_created_on_first_use_with_a_version(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    exists = "SELECT to_regclass(quote_ident(%s))"
    assert raw.execute(exists, (table,)).fetchone() == (None,)
    assert store.get_messages("nobody") == []
    for name in (table, f"{table}_history", f"{table}_conversations", f"{table}_schema"):
        assert raw.execute(exists, (name,)).fetchone() != (None,), name
    version = raw.execute(
        sql.SQL("SELECT value FROM {} WHERE name = 'version'").format(ident(f"{table}_schema"))
    ).fetchone()
    assert version == (str(SCHEMA_VERSION),)


def test_the_window_is_indexed_by_memory_key_and_seq(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    store.create_schema()
    indexes = {
        definition.split(" USING ")[1]
        for (definition,) in raw.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s", (table,)
        )
    }
    assert indexes == {"btree (memory_key, seq)", "btree (memory_key, message_id)"}


def test_create_schema_is_idempotent_and_safe_from_many_threads(dsn: str, table: str) -> None:
    stores = [PostgresChatMemoryStore(dsn, table=table) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def first_use(store: PostgresChatMemoryStore) -> None:
        barrier.wait()
        try:
            store.apply_changes("c", appended=[user("x")], removed=[])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stores[0].create_schema()
    assert len(stores[0].get_messages("c")) == 4
    for s in stores:
        s.close()


def test_a_newer_schema_is_refused_with_a_clear_error(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], dsn: str, table: str
) -> None:
    store.create_schema()
    raw.execute(
        sql.SQL("UPDATE {} SET value = '99' WHERE name = 'version'").format(
            ident(f"{table}_schema")
        )
    )
    with (
        PostgresChatMemoryStore(dsn, table=table) as other,
        pytest.raises(StoreSchemaError, match=r"schema version 99, newer .*upgrade aiservices"),
    ):
        other.get_messages("c")


def test_a_table_it_did_not_make_is_refused(
    raw: psycopg.Connection[Any], dsn: str, table: str
) -> None:
    raw.execute(sql.SQL("CREATE TABLE {} (id int)").format(ident(table)))
    with (
        PostgresChatMemoryStore(dsn, table=table) as store,
        pytest.raises(StoreSchemaError, match="not made by aiservices; pass another table="),
    ):
        store.create_schema()


def test_odd_table_names_are_quoted(dsn: str, table: str) -> None:
    odd = f'{table[:20]} "Odd"; --'
    try:
        with PostgresChatMemoryStore(dsn, table=odd) as store:
            store.update_messages("a", [user("fine")])
            assert texts(store.get_messages("a")) == ["fine"]
    finally:
        drop_postgres_tables(dsn, odd)


def test_rows_carry_their_metadata_in_columns(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    naive = datetime(2024, 5, 1, 12, 30)
    aware = datetime(2024, 5, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    store.apply_changes(
        ("k", 1),
        appended=[
            UserMessage("hi", message_id="m1", turn_id="t1", created_at=naive),
            AiMessage("yo", message_id="m2", created_at=aware),
        ],
        removed=[],
    )
    rows = raw.execute(
        sql.SQL(
            "SELECT memory_key, seq, message_id, turn_id, created_at, stored_at, message "
            "FROM {} ORDER BY seq"
        ).format(ident(table))
    ).fetchall()
    assert [r[0] for r in rows] == ["\x1ftuple:('k', 1)"] * 2
    assert rows[1][1] == rows[0][1] + 1  # numbered in order (from the clock, in µs)
    assert [r[2:4] for r in rows] == [("m1", "t1"), ("m2", None)]
    assert rows[0][4] == naive.replace(tzinfo=UTC)  # a naive time is read as UTC
    assert rows[1][4] == aware
    assert abs(rows[0][5] - datetime.now(UTC)) < timedelta(minutes=1)
    assert '"text":"hi"' in rows[0][6]


def test_a_memory_id_with_a_nul_is_filed_under_its_digest(store: PostgresChatMemoryStore) -> None:
    # PostgreSQL text can't hold a NUL: the key is a digest, and the id is kept in bytea.
    store.update_messages("a\x00b", [user("x")])
    assert texts(store.get_messages("a\x00b")) == ["x"]
    assert store.get_messages("a") == []
    assert list(store.memory_ids()) == ["a\x00b"]


# -- writes only what changed ------------------------------------------------------------------


def row_versions(raw: psycopg.Connection[Any], table: str) -> dict[str, str]:
    """Each window row's message_id and the transaction that last wrote it."""
    rows = raw.execute(
        sql.SQL("SELECT message_id, xmin::text FROM {}").format(ident(table))
    ).fetchall()
    return dict(rows)


def test_a_turn_writes_only_its_rows_whatever_the_window(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    window = [user(str(i)) for i in range(1000)]
    store.update_messages("c", window)
    before = row_versions(raw, table)
    new = [user("q"), AiMessage("a", message_id=new_message_id())]
    store.apply_changes("c", appended=new, removed=[window[0].message_id, window[1].message_id])
    after = row_versions(raw, table)
    assert set(before) - set(after) == {window[0].message_id, window[1].message_id}
    assert {mid for mid, v in after.items() if before.get(mid) != v} == {m.message_id for m in new}
    assert texts(store.get_messages("c")) == [*texts(window[2:]), "q", "a"]


def test_update_messages_writes_the_difference(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    sys = SystemMessage("pinned", message_id=new_message_id())
    window: list[ChatMessage] = [sys, *(user(str(i)) for i in range(500))]
    store.update_messages("c", window)
    before = row_versions(raw, table)
    window = [sys, *window[3:], user("new 1"), user("new 2")]
    store.update_messages("c", window)
    after = row_versions(raw, table)
    assert len(before) - len(set(before) & set(after)) == 2
    assert {mid for mid, v in after.items() if before.get(mid) != v} == {
        m.message_id for m in window[-2:]
    }
    store.update_messages("c", window)
    assert row_versions(raw, table) == after
    assert texts(store.get_messages("c")) == texts(window)


def test_a_reordering_update_renumbers_rows_in_place(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    a, b, c = user("a"), user("b"), user("c")
    store.update_messages("c", [a, b, c])
    edited = UserMessage("b, edited", message_id=b.message_id)
    store.update_messages("c", [c, edited, a, user("d")])
    assert texts(store.get_messages("c")) == ["c", "b, edited", "a", "d"]
    seqs = raw.execute(
        sql.SQL("SELECT message_id, seq FROM {} ORDER BY seq").format(ident(table))
    ).fetchall()
    assert [mid for mid, _ in seqs][:3] == [c.message_id, b.message_id, a.message_id]
    first = seqs[0][1]
    assert [seq for _, seq in seqs] == [first, first + 1, first + 2, first + 3]
    assert first > 3  # numbers are never reused


# -- concurrency ---------------------------------------------------------------------------------


def waiting_on_a_lock(raw: psycopg.Connection[Any]) -> int:
    (n,) = raw.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchone() or (0,)
    return int(n)


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_writers_of_one_conversation_queue_on_its_row(
    store: PostgresChatMemoryStore, dsn: str, raw: psycopg.Connection[Any], table: str
) -> None:
    store.apply_changes("c", appended=[user("first")], removed=[])
    before = waiting_on_a_lock(raw)
    with psycopg.connect(dsn) as holder:
        holder.execute(
            sql.SQL("SELECT * FROM {} WHERE memory_key = 'c' FOR UPDATE").format(
                ident(f"{table}_conversations")
            )
        )
        writer = threading.Thread(
            target=store.apply_changes,
            args=("c",),
            kwargs={"appended": [user("second")], "removed": []},
        )
        writer.start()
        wait_until(lambda: waiting_on_a_lock(raw) > before)
        assert writer.is_alive()
        store.apply_changes("other", appended=[user("not held up")], removed=[])
        holder.commit()
    writer.join(10)
    assert texts(store.get_messages("c")) == ["first", "second"]


def test_a_removal_finds_a_row_another_writer_is_renumbering(
    store: PostgresChatMemoryStore, dsn: str, raw: psycopg.Connection[Any], table: str
) -> None:
    a, b = user("a"), user("b")
    store.update_messages("c", [a, b])
    with psycopg.connect(dsn) as renumbering:
        renumbering.execute(
            sql.SQL("UPDATE {} SET seq = seq + 100 WHERE memory_key = 'c'").format(ident(table))
        )
        before = waiting_on_a_lock(raw)
        remover = threading.Thread(
            target=store.apply_changes,
            args=("c",),
            kwargs={"appended": [], "removed": [a.message_id]},
        )
        remover.start()
        wait_until(lambda: waiting_on_a_lock(raw) > before)
        renumbering.commit()
    remover.join(10)
    assert texts(store.get_messages("c")) == ["b"]


@pytest.mark.parametrize("rival", ["forget", "delete_messages", "update_messages"])
@pytest.mark.parametrize("keep_history", [False, True])
def test_a_turn_evicting_beside_another_writer_takes_locks_in_one_order(
    dsn: str, raw: psycopg.Connection[Any], table: str, rival: str, keep_history: bool
) -> None:
    # Every writer locks the conversation's row before its message rows: a turn that took a
    # row it evicts first, and a rival that took the conversation first, would deadlock.
    old, kept = user("old"), user("kept")
    with PostgresChatMemoryStore(dsn, table=table, keep_history=keep_history) as store:
        store.update_messages("c", [old, kept])
        failures: list[BaseException] = []

        def run(call: Any, *args: Any, **kwargs: Any) -> threading.Thread:
            def target() -> None:
                try:
                    call(*args, **kwargs)
                except BaseException as exc:
                    failures.append(exc)

            thread = threading.Thread(target=target)
            thread.start()
            return thread

        with psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL(
                    "SELECT 1 FROM {} WHERE memory_key = 'c' AND message_id = %s FOR UPDATE"
                ).format(ident(table)),
                (old.message_id,),
            )
            before = waiting_on_a_lock(raw)
            turn = run(store.apply_changes, "c", appended=[user("new")], removed=[old.message_id])
            wait_until(lambda: waiting_on_a_lock(raw) > before)
            if rival == "update_messages":
                other = run(store.update_messages, "c", [kept, user("edited")])
            else:
                other = run(getattr(store, rival), "c")
            wait_until(lambda: waiting_on_a_lock(raw) > before + 1)
            holder.commit()
        turn.join(10)
        other.join(10)
        assert not failures
        # The turn went first: the rival saw what it wrote.
        expected = {"forget": [], "delete_messages": [], "update_messages": ["kept", "edited"]}
        assert texts(store.get_messages("c")) == expected[rival]


# -- corrupt rows ----------------------------------------------------------------------------------


def test_a_corrupt_row_is_reported_with_the_memory_id_and_seq(
    store: PostgresChatMemoryStore, raw: psycopg.Connection[Any], table: str
) -> None:
    store.update_messages("alice", [user("a"), user("b")])
    ((second,),) = raw.execute(sql.SQL("SELECT max(seq) FROM {}").format(ident(table))).fetchall()
    raw.execute(
        sql.SQL('UPDATE {} SET message = \'{{"type": "user"\' WHERE seq = %s').format(ident(table)),
        (second,),
    )
    with pytest.raises(CorruptMessageError) as caught:
        store.get_messages("alice")
    assert caught.value.memory_id == "alice"
    assert caught.value.row == second
    assert f"memory_key = 'alice' and seq = {second} in table {table!r}" in str(caught.value)
    store.delete_messages("alice")
    assert store.get_messages("alice") == []


def test_a_duplicate_is_named_and_changes_nothing(store: PostgresChatMemoryStore) -> None:
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    twin = UserMessage("twin", message_id=b.message_id)
    with pytest.raises(ValueError, match=f"message_id '{b.message_id}' appears twice"):
        store.apply_changes("c", appended=[user("new"), twin], removed=[a.message_id])
    assert texts(store.get_messages("c")) == ["a", "b"]


# -- pools and connections ---------------------------------------------------------------------


def test_a_pool_passed_in_is_used_and_left_open(dsn: str, table: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = PostgresChatMemoryStore(pool, table=table, keep_history=True)
        first = user("a")
        store.apply_changes("c", appended=[first, user("b")], removed=[])
        store.apply_changes("c", appended=[], removed=[first.message_id])
        assert texts(store.get_messages("c")) == ["b"]
        assert [e.evicted for e in store.get_history("c")] == [True, False]
        store.close()
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_pool_and_connection_with_another_row_factory_work(dsn: str, table: str) -> None:
    from psycopg.rows import dict_row

    with ConnectionPool(dsn, kwargs={"row_factory": dict_row, "autocommit": True}) as pool:
        with PostgresChatMemoryStore(pool, table=table) as store:
            store.update_messages("c", [user("a")])
            store.apply_changes("c", appended=[user("b")], removed=[])
            since = store.get_messages_since("c")[1]
            assert texts(store.get_messages_since("c", since)[0]) == ["a", "b"]
        with PostgresChatMemoryStore(pool, table=table) as again:  # the schema checked again
            assert texts(again.get_messages("c")) == ["a", "b"]

    async def main() -> list[str]:
        async with (
            AsyncConnectionPool(
                dsn, kwargs={"row_factory": dict_row, "autocommit": True}, open=False
            ) as apool,
            PostgresChatMemoryStore(dsn, table=table, async_pool=apool) as store,
        ):
            await store.aapply_changes("c", appended=[user("c")], removed=[])
            return texts(await store.aget_messages("c"))

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_a_connection_passed_in_is_shared_by_threads(dsn: str, table: str) -> None:
    with psycopg.connect(dsn) as conn:  # autocommit off: each call commits its own work
        store = PostgresChatMemoryStore(conn, table=table)

        def work(worker: int) -> None:
            for i in range(10):
                store.apply_changes("c", appended=[user(f"{worker}:{i}")], removed=[])
                store.get_messages("c")

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with PostgresChatMemoryStore(dsn, table=table) as other:
        assert len(other.get_messages("c")) == 40


def test_retention_purges_from_the_stores_first_write(
    dsn: str, table: str, raw: psycopg.Connection[Any]
) -> None:
    # A process that lives less than a tenth of the period (a job, a recycled worker) must
    # still purge what is idle.
    with PostgresChatMemoryStore(dsn, table=table) as store:
        store.apply_changes("old", appended=[user("last week")], removed=[])
    raw.execute(
        sql.SQL("UPDATE {} SET stored_at = stored_at - interval '48 hours'").format(ident(table))
    )
    with PostgresChatMemoryStore(dsn, table=table, retention=timedelta(days=1)) as fresh:
        fresh.apply_changes("new", appended=[user("hello")], removed=[])
        assert list(fresh.memory_ids()) == ["new"]
        fresh.apply_changes("new", appended=[user("again")], removed=[])  # not every write
        assert fresh._next_purge > time.monotonic() + 3600 - 60


@pytest.mark.parametrize("used", [True, False], ids=["used", "unused"])
def test_a_closed_store_refuses_calls_and_says_it_was_closed(
    dsn: str, table: str, used: bool
) -> None:
    store = PostgresChatMemoryStore(dsn, table=table)
    if used:
        store.apply_changes("c", appended=[user("hi")], removed=[])
    store.close()
    with pytest.raises(psycopg.OperationalError, match="was closed: make a new"):
        store.get_messages("c")

    async def call() -> None:
        await store.aget_messages("c")

    # An async call made no pool of its own for its event loop, and opened no connection.
    with pytest.raises(psycopg.OperationalError, match="was closed: make a new"):
        asyncio.run(call())


def test_async_methods_use_a_pool_per_event_loop(dsn: str, table: str) -> None:
    store = PostgresChatMemoryStore(dsn, table=table)

    async def turn(text: str) -> list[str | None]:
        await store.aapply_changes("c", appended=[user(text)], removed=[])
        got = texts(await store.aget_messages("c"))
        await store.aclose()
        return got

    assert asyncio.run(turn("a")) == ["a"]
    store = PostgresChatMemoryStore(dsn, table=table)
    assert asyncio.run(turn("b")) == ["a", "b"]


def test_asyncio_run_of_an_async_call_returns(dsn: str, table: str) -> None:
    # Each asyncio.run() gets a pool of its own; a connection that pool opened ahead, still
    # connecting when the loop ended, swallowed asyncio.run's final cancellation and the
    # process hung there (in about one run in three).
    import subprocess
    import sys

    child = (
        "import asyncio, sys\n"
        "from aiservices import MessageWindowChatMemory, UserMessage\n"
        "from aiservices.stores import PostgresChatMemoryStore\n"
        "store = PostgresChatMemoryStore(sys.argv[1], table=sys.argv[2])\n"
        "memory = MessageWindowChatMemory(10, id=sys.argv[3], store=store)\n"
        "memory.add(UserMessage('hi'))\n"
        "first = asyncio.run(memory.amessages())\n"
        "second = asyncio.run(store.aget_messages(sys.argv[3]))\n"
        "print(len(first), len(second))\n"
    )
    for run in range(8):
        done = subprocess.run(
            [sys.executable, "-c", child, dsn, table, f"run {run}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1", "1"]


async def test_async_twins_match_the_sync_methods(dsn: str, table: str) -> None:
    async with PostgresChatMemoryStore(dsn, table=table, keep_history=True) as store:
        a, b = user("a"), user("b")
        await store.aupdate_messages("c", [a, b])
        await store.aapply_changes("c", appended=[user("c")], removed=[a.message_id])
        assert texts(await store.aget_messages("c")) == ["b", "c"]
        with pytest.raises(ValueError, match="appears twice"):
            await store.aapply_changes("c", appended=[b], removed=[])
        await store.adelete_messages("c")
        assert await store.aget_messages("c") == []
        history = await store.aget_history("c")
        assert [(texts([e.message])[0], e.evicted) for e in history] == [
            ("a", True),
            ("b", True),
            ("c", True),
        ]
        await store.aforget("c")
        assert await store.aget_history("c") == []


async def test_a_given_async_pool_is_used_and_left_open(dsn: str, table: str) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
        with ConnectionPool(dsn, min_size=1, max_size=1, open=True) as sync_pool:
            store = PostgresChatMemoryStore(sync_pool, table=table, async_pool=pool)
            await store.aapply_changes("c", appended=[user("a")], removed=[])
            assert pool.get_stats()["requests_num"] >= 1
            assert sync_pool.get_stats().get("requests_num", 0) == 0
            assert texts(await store.aget_messages("c")) == ["a"]
            await store.aclose()
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")


async def test_an_async_duplicate_is_named_without_blocking_the_event_loop(
    dsn: str, table: str
) -> None:
    # Naming the stored id takes a query after the rollback: an async write asks it through
    # the async pool, never with a blocking call on the event loop.
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
        with ConnectionPool(dsn, min_size=1, max_size=1, open=True) as sync_pool:
            store = PostgresChatMemoryStore(sync_pool, table=table, async_pool=pool)
            a, b = user("a"), user("b")
            await store.aapply_changes("c", appended=[a, b], removed=[])
            twin = UserMessage("twin", message_id=b.message_id)
            with pytest.raises(ValueError, match=f"message_id '{b.message_id}' appears twice"):
                await store.aapply_changes("c", appended=[user("new"), twin], removed=[])
            assert sync_pool.get_stats().get("requests_num", 0) == 0
            assert texts(await store.aget_messages("c")) == ["a", "b"]
            await store.aclose()


async def test_a_given_pool_without_an_async_one_works_from_a_thread(dsn: str, table: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = PostgresChatMemoryStore(pool, table=table)
        await store.aapply_changes("c", appended=[user("a")], removed=[])
        assert texts(await store.aget_messages("c")) == ["a"]
