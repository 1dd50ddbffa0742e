"""PostgreSQL faults: a frozen or stopped server, and memory ids the server can't take as keys.

What must hold: a call on a frozen server fails within the store's timeout (plus 2 s) with
an error naming the server, and frees its conversation for the next call; a call on a
stopped server fails at once, saying the server is unreachable, not after the timeout; in
both cases the memory is not left ahead of the store and the next call after the server is
back works. Any memory id is stored and listed back as given, whether its key is too long
to index (a 10,000-character id that does not compress) or not valid UTF-8 (a lone
surrogate): through a store, and through a service turn that calls the model once.

The frozen and stopped servers are a cluster of these tests' own (see
``test_store_failures``), frozen with SIGSTOP and thawed with SIGCONT; never the shared one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from aiservices.stores import StoreSchemaError
from aiservices.stores.postgres import MAX_KEY_BYTES, SCHEMA_VERSION, PostgresChatMemoryStore

from ._messages import texts, user
from ._server_backends import drop_postgres_tables, require_postgres
from .test_store_failures import (
    BEFORE,
    ABot,
    Model,
    PostgresCluster,
    acheck_recovered,
    check_recovered,
    postgres_cluster,  # noqa: F401 (a fixture running_postgres needs)
    running_postgres,  # noqa: F401 (a fixture)
    service,
    two_turns,
)

# -- a server that stops answering ------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # the process ended
            # pid (comm) state ppid ...; comm may hold spaces and parentheses
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


class Freezer:
    """Stops every process of a cluster (SIGSTOP) and lets them go on (SIGCONT).

    A frozen server keeps its sockets open and its kernel still accepts connections and
    acknowledges what it is sent; nothing ever answers.
    """

    def __init__(self, cluster: PostgresCluster) -> None:
        self.cluster = cluster
        self.frozen: list[int] = []

    def freeze(self) -> None:
        pid_file = self.cluster.directory / "data" / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)  # first, so that it starts no other process
        self.frozen.append(postmaster)
        for child in _children(postmaster):
            os.kill(child, signal.SIGSTOP)
            self.frozen.append(child)

    def thaw(self) -> None:
        for pid in reversed(self.frozen):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen.clear()


@pytest.fixture
def freezer(running_postgres: PostgresCluster) -> Iterator[Freezer]:  # noqa: F811
    if not Path("/proc/self/stat").exists():
        pytest.skip("freezing a server's processes needs Linux's /proc")
    freezer = Freezer(running_postgres)
    try:
        yield freezer
    finally:
        freezer.thaw()  # before running_postgres checks the server


def private_store(cluster: PostgresCluster, **options: Any) -> PostgresChatMemoryStore:
    return PostgresChatMemoryStore(cluster.dsn, table=f"t_{uuid.uuid4().hex}", **options)


TIMEOUT = 3.0
SLACK = 2.0  # what a loaded machine may add to a deadline


@pytest.mark.slow
def test_a_frozen_server_fails_a_call_within_the_timeout(freezer: Freezer) -> None:
    cluster = freezer.cluster
    model = Model()
    with private_store(cluster, timeout=TIMEOUT) as store:
        bot = service(store, model)
        two_turns(bot)
        asked = len(model.requests)
        freezer.freeze()
        for question in ("frozen", "still frozen"):  # the first call freed the conversation
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match=f"port={cluster.port}") as caught:
                bot.chat("alice", question)
            assert time.monotonic() - started < TIMEOUT + SLACK
            assert f"within {TIMEOUT:g} s" in str(caught.value)
        assert len(model.requests) == asked  # the read failed: the model was never called
        freezer.thaw()
        check_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
async def test_a_frozen_server_fails_an_async_call_within_the_timeout(freezer: Freezer) -> None:
    cluster = freezer.cluster
    model = Model()
    async with private_store(cluster, timeout=TIMEOUT) as store:
        bot = service(store, model, ABot)
        for question in ("q1", "q2"):
            assert await bot.chat("alice", question) == f"answer to {question}"
        freezer.freeze()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match=f"port={cluster.port}"):
            await bot.chat("alice", "frozen")
        assert time.monotonic() - started < TIMEOUT + SLACK
        freezer.thaw()
        await acheck_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
def test_a_server_frozen_during_the_write_fails_the_call_and_changes_nothing(
    freezer: Freezer,
) -> None:
    # The write reached the server before it froze. When the server goes on, it runs the
    # statement; but the call, which gave up, never sent the commit, so it is rolled back.
    cluster = freezer.cluster
    model = Model()
    with private_store(cluster, timeout=TIMEOUT) as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["frozen"] = freezer.freeze
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match=f"port={cluster.port}"):
            bot.chat("alice", "frozen")
        assert time.monotonic() - started < TIMEOUT + SLACK
        freezer.thaw()
        time.sleep(0.5)  # time for the server to run what it had been sent
        check_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
@pytest.mark.parametrize("first_use", [True, False], ids=["before-first-use", "after-use"])
def test_a_stopped_server_fails_a_call_at_once_saying_it_is_unreachable(
    running_postgres: PostgresCluster,  # noqa: F811
    first_use: bool,
) -> None:
    model = Model()
    with private_store(running_postgres) as store:  # the default timeout, 15 s
        bot = service(store, model)
        if not first_use:
            two_turns(bot)
        asked = len(model.requests)
        running_postgres.stop()
        for question in ("down", "still down"):
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError, match="unreachable") as caught:
                bot.chat("alice", question)
            assert time.monotonic() - started < 5.0
            assert f"port={running_postgres.port}" in str(caught.value)
        assert len(model.requests) == asked
        running_postgres.start()
        if first_use:
            assert bot.chat("alice", "back") == "answer to back"
        else:
            check_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
async def test_a_stopped_server_fails_an_async_call_at_once(
    running_postgres: PostgresCluster,  # noqa: F811
) -> None:
    model = Model()
    async with private_store(running_postgres) as store:
        bot = service(store, model, ABot)
        for question in ("q1", "q2"):
            assert await bot.chat("alice", question) == f"answer to {question}"
        running_postgres.stop()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="unreachable"):
            await bot.chat("alice", "down")
        assert time.monotonic() - started < 5.0
        running_postgres.start()
        await acheck_recovered(bot, model, store, BEFORE)


# -- a server with no room for another connection --------------------------------------------


class Limited:
    """A role that may hold two connections at once, as a full server allows no more."""

    def __init__(self, cluster: PostgresCluster) -> None:
        role = f"limited_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(cluster.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 2").format(sql.Identifier(role))
            )
            admin.execute(sql.SQL("GRANT ALL ON SCHEMA public TO {}").format(sql.Identifier(role)))
        self.dsn = cluster.dsn.replace("user=postgres", f"user={role}")
        self.taken: list[psycopg.Connection[Any]] = []

    def fill(self) -> None:
        """Take every connection the role has left."""
        while True:
            try:
                self.taken.append(psycopg.connect(self.dsn, connect_timeout=2))
            except psycopg.OperationalError:
                return

    def free(self) -> None:
        while self.taken:
            self.taken.pop().close()


@pytest.fixture
def limited(running_postgres: PostgresCluster) -> Iterator[Limited]:  # noqa: F811
    role = Limited(running_postgres)
    try:
        yield role
    finally:
        role.free()


@pytest.mark.slow
def test_a_full_server_leaves_the_pools_own_connections_in_use(
    running_postgres: PostgresCluster,  # noqa: F811
    limited: Limited,
) -> None:
    table = f"t_{uuid.uuid4().hex}"
    with PostgresChatMemoryStore(limited.dsn, table=table, max_connections=3) as store:
        store.update_messages("a", [user("one")])  # the pool holds one connection now
        limited.fill()  # the pool can't grow any more
        with psycopg.connect(running_postgres.dsn) as admin:
            # A call that waits while the table is locked makes it try, and fail.
            admin.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table))
            )
            failures: list[BaseException] = []

            def read() -> None:
                try:
                    store.get_messages("a")
                except psycopg.Error as exc:
                    failures.append(exc)

            # One more call than the role's two connections.
            threads = [threading.Thread(target=read) for _ in range(3)]
            for thread in threads:
                thread.start()
            time.sleep(1.0)
            admin.rollback()
            for thread in threads:
                thread.join()
            assert failures  # the calls that found no connection to use
            for refused in failures:
                assert "refused the connection" in str(refused)
                assert "too many connections" in str(refused)
                assert "unreachable" not in str(refused)
            # One call at a time, the pool's idle connection serves while the server is full.
            for n in range(3):
                started = time.monotonic()
                assert texts(store.get_messages("a")) == ["one"], n
                assert time.monotonic() - started < 1.0
        limited.free()
        store.update_messages("a", [user("one"), user("two")])
        assert texts(store.get_messages("a")) == ["one", "two"]


@pytest.mark.slow
async def test_a_full_server_leaves_the_async_pools_own_connections_in_use(
    running_postgres: PostgresCluster,  # noqa: F811
    limited: Limited,
) -> None:
    table = f"t_{uuid.uuid4().hex}"
    async with PostgresChatMemoryStore(limited.dsn, table=table, max_connections=3) as store:
        await store.aupdate_messages("a", [user("one")])
        limited.fill()
        with psycopg.connect(running_postgres.dsn) as admin:
            admin.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table))
            )

            async def unlock() -> None:
                await asyncio.sleep(1.0)
                admin.rollback()

            found = await asyncio.gather(
                *(store.aget_messages("a") for _ in range(3)), unlock(), return_exceptions=True
            )
            assert any(isinstance(f, psycopg.OperationalError) for f in found)
            for n in range(3):
                started = time.monotonic()
                assert texts(await store.aget_messages("a")) == ["one"], n
                assert time.monotonic() - started < 1.0
        limited.free()


@pytest.mark.slow
def test_a_server_that_refuses_a_role_says_so_rather_than_unreachable(
    running_postgres: PostgresCluster,  # noqa: F811
) -> None:
    dsn = running_postgres.dsn.replace("user=postgres", "user=nobody_here")
    with pytest.raises(psycopg.OperationalError) as caught:
        PostgresChatMemoryStore(dsn, table=f"t_{uuid.uuid4().hex}").get_messages("a")
    said = str(caught.value)
    assert "refused the connection" in said
    assert "check the DSN's user, password and database" in said
    assert "unreachable" not in said


# -- a server restarted under a pool of idle connections ------------------------------------------

IDLE = 8  # a pool pausing after each failed check (1 s, 2 s, 4 s...) would reach the timeout


def _hold_connections(cluster: PostgresCluster, store: PostgresChatMemoryStore) -> None:
    # IDLE writers wait on one conversation's row at once, so the pool opens IDLE connections,
    # which stay idle in it once the row is let go.
    store.apply_changes("held", appended=[user("first")], removed=[])
    with psycopg.connect(cluster.dsn) as holder:
        holder.execute(
            sql.SQL("SELECT 1 FROM {} WHERE memory_key = 'held' FOR UPDATE").format(
                sql.Identifier(f"{store.table}_conversations")
            )
        )
        writers = [
            threading.Thread(
                target=store.apply_changes,
                args=("held",),
                kwargs={"appended": [user(f"w{i}")], "removed": []},
            )
            for i in range(IDLE)
        ]
        for writer in writers:
            writer.start()
        with psycopg.connect(cluster.dsn, autocommit=True) as watcher:
            _wait_for_waiters(watcher, IDLE)
        holder.commit()
    for writer in writers:
        writer.join(10)
    assert len(store.get_messages("held")) == IDLE + 1


def _wait_for_waiters(conn: psycopg.Connection[Any], n: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()
        if row is not None and row[0] >= n:
            return
        assert time.monotonic() < deadline, "the writers never queued"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_restarted_server_is_used_at_once_though_every_idle_connection_died(
    running_postgres: PostgresCluster,  # noqa: F811
) -> None:
    with private_store(running_postgres) as store:  # the default timeout, 15 s
        _hold_connections(running_postgres, store)
        running_postgres.stop()
        running_postgres.start()
        started = time.monotonic()
        store.apply_changes("after", appended=[user("back")], removed=[])
        assert time.monotonic() - started < 5.0
        assert texts(store.get_messages("after")) == ["back"]


@pytest.mark.slow
async def test_a_restarted_server_is_used_at_once_by_async_calls(
    running_postgres: PostgresCluster,  # noqa: F811
) -> None:
    async with private_store(running_postgres) as store:
        await store.aapply_changes("held", appended=[user("first")], removed=[])
        holder = await psycopg.AsyncConnection.connect(running_postgres.dsn)
        async with holder:
            await holder.execute(
                sql.SQL("SELECT 1 FROM {} WHERE memory_key = 'held' FOR UPDATE").format(
                    sql.Identifier(f"{store.table}_conversations")
                )
            )
            writers = [
                asyncio.create_task(
                    store.aapply_changes("held", appended=[user(f"w{i}")], removed=[])
                )
                for i in range(IDLE)
            ]
            with psycopg.connect(running_postgres.dsn, autocommit=True) as watcher:
                await asyncio.to_thread(_wait_for_waiters, watcher, IDLE)
            await holder.commit()
        await asyncio.gather(*writers)
        running_postgres.stop()
        running_postgres.start()
        started = time.monotonic()
        await store.aapply_changes("after", appended=[user("back")], removed=[])
        assert time.monotonic() - started < 5.0
        assert texts(await store.aget_messages("after")) == ["back"]


# -- the server's own timeouts ----------------------------------------------------------------


@pytest.fixture
def dsn() -> str:
    return require_postgres()


@pytest.fixture
def table(dsn: str) -> Iterator[str]:
    table = f"t_{uuid.uuid4().hex}"
    yield table
    drop_postgres_tables(dsn, table)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_timeout": 0.3}, psycopg.errors.LockNotAvailable),
        ({"lock_timeout": None, "statement_timeout": 0.3}, psycopg.errors.QueryCanceled),
    ],
    ids=["lock_timeout", "statement_timeout"],
)
def test_a_write_held_up_by_a_lock_is_cancelled_by_the_server(
    dsn: str, table: str, options: dict[str, Any], error: type[Exception]
) -> None:
    with PostgresChatMemoryStore(dsn, table=table, **options) as store:
        store.apply_changes("c", appended=[user("first")], removed=[])
        with psycopg.connect(dsn) as holder:
            holder.execute(
                sql.SQL("SELECT * FROM {} WHERE memory_key = 'c' FOR UPDATE").format(
                    sql.Identifier(f"{table}_conversations")
                )
            )
            started = time.monotonic()
            with pytest.raises(error):
                store.apply_changes("c", appended=[user("second")], removed=[])
            assert time.monotonic() - started < 0.3 + SLACK
            holder.rollback()
        store.apply_changes("c", appended=[user("third")], removed=[])
        assert texts(store.get_messages("c")) == ["first", "third"]


def test_bad_timeouts_are_clear_errors(dsn: str) -> None:
    for name in ("timeout", "connect_timeout", "statement_timeout", "lock_timeout"):
        with pytest.raises(ValueError, match=f"{name} must be a finite number of seconds > 0"):
            PostgresChatMemoryStore(dsn, **{name: -1})


# -- a DSN or connection settings that no retry passes ---------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("host=127.0.0.1 dbname=test usr=postgres password=s3cret", 'option "usr"'),
        ("postgresql://app:s3cret@127.0.0.1/test?usr=app", 'URI query parameter: "usr"'),
        ("host=127.0.0.1 password=s3cret w0rd dbname=test", r'missing "=" after "\*\*\*"'),
        ("postgresql://app:s3cret@[::1/test", r'"postgresql://app:\*\*\*@\[::1/test"'),
        ("postgresql://app:s3%ZZw0rd@127.0.0.1/test", r'percent-encoded token: "\*\*\*"'),
        ("host=127.0.0.1 password='s3cret", "unterminated quoted string"),
    ],
)
def test_a_dsn_libpq_cannot_read_is_refused_when_the_store_is_made(dsn: str, said: str) -> None:
    # The pool would retry it in the background, and every call wait out its timeout and
    # then blame the pool's size.
    with pytest.raises(psycopg.ProgrammingError, match=said) as caught:
        PostgresChatMemoryStore(dsn)
    message = str(caught.value)
    assert "not a valid libpq connection string or URL" in message
    assert "check the option names" in message
    assert "s3" not in message
    assert "w0rd" not in message
    assert caught.value.__suppress_context__  # psycopg's own error may quote the password


def test_a_pool_whose_conninfo_libpq_cannot_read_is_refused(table: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool("host=127.0.0.1 usr=postgres", open=False)
    with pytest.raises(psycopg.ProgrammingError, match=r'conninfo of the pool .*option "usr"'):
        PostgresChatMemoryStore(pool, table=table)


def _refused(*args: Any, **kwargs: Any) -> Any:
    raise psycopg.ProgrammingError("refused by the client: not a server's answer")


async def _arefused(*args: Any, **kwargs: Any) -> Any:
    _refused()


def test_an_error_no_retry_passes_fails_a_call_at_once(
    dsn: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not an OperationalError: the pool retries in the background all the same, and a call
    # that waited for it would time out blaming the pool.
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(_refused))
    with PostgresChatMemoryStore(dsn, table=table, timeout=5) as store:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(psycopg.ProgrammingError, match="refused by the client") as caught:
                store.get_messages("c")
            assert time.monotonic() - started < 2.0
            assert "connecting to the PostgreSQL server at " in str(caught.value)
            assert "host=127.0.0.1" in str(caught.value)


async def test_an_error_no_retry_passes_fails_an_async_call_at_once(
    dsn: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(_arefused))
    async with PostgresChatMemoryStore(dsn, table=table, timeout=5) as store:
        started = time.monotonic()
        with pytest.raises(psycopg.ProgrammingError, match="refused by the client"):
            await store.aget_messages("c")
        assert time.monotonic() - started < 2.0


# -- memory ids the server can't take as keys -----------------------------------------------------


def incompressible_id(length: int = 10_000) -> str:
    # CJK ideographs at random: three bytes of UTF-8 each, which no compression shrinks
    # below the index's limit.
    rng = random.Random(21)
    return "".join(chr(rng.randrange(0x4E00, 0xA000)) for _ in range(length))


LONG = incompressible_id()
ODD_IDS = {
    "long": LONG,
    "long-twin": LONG[:-1] + ("x" if LONG[-1] != "x" else "y"),
    "lone-surrogate": "alice\ud800",
    "nul": "a\x00b",
    "long-compressible": "ab" * 5_000,
    "digest-lookalike": "\x1f#" + "0" * 64,
}


def test_any_memory_id_round_trips_through_a_store(dsn: str, table: str) -> None:
    with PostgresChatMemoryStore(dsn, table=table, keep_history=True) as store:
        for name, memory_id in ODD_IDS.items():
            store.check_memory_id(memory_id)
            first = user(f"{name} 1")
            store.apply_changes(memory_id, appended=[first, user(f"{name} 2")], removed=[])
            store.apply_changes(memory_id, appended=[], removed=[first.message_id])
        for name, memory_id in ODD_IDS.items():
            assert texts(store.get_messages(memory_id)) == [f"{name} 2"], name
            assert [e.evicted for e in store.get_history(memory_id)] == [True, False]
        with PostgresChatMemoryStore(dsn, table=table) as other:
            assert sorted(other.memory_ids()) == sorted(ODD_IDS.values())
        store.forget(LONG)
        assert store.get_history(LONG) == []
        assert LONG not in set(store.memory_ids())


def test_a_key_that_cannot_be_indexed_is_a_fixed_size_digest(dsn: str, table: str) -> None:
    with PostgresChatMemoryStore(dsn, table=table) as store, psycopg.connect(dsn) as raw:
        store.update_messages(LONG, [user("x")])
        store.update_messages("a" * MAX_KEY_BYTES, [user("y")])
        keys = raw.execute(
            sql.SQL("SELECT memory_key, full_key FROM {} ORDER BY memory_key").format(
                sql.Identifier(f"{table}_conversations")
            )
        ).fetchall()
        assert keys == [
            ("\x1f#" + hashlib.sha256(LONG.encode()).hexdigest(), LONG.encode()),
            ("a" * MAX_KEY_BYTES, None),  # a key that fits is itself
        ]


def test_check_memory_id_takes_any_id_without_a_server() -> None:
    store = PostgresChatMemoryStore("host=127.0.0.1 port=1 dbname=none")
    for memory_id in (*ODD_IDS.values(), 1, 1.5, True, uuid.uuid4(), ("k", 1)):
        assert store.check_memory_id(memory_id) is None
    store.close()


@pytest.mark.parametrize("name", ["long", "lone-surrogate"])
def test_any_memory_id_round_trips_through_a_service_turn(dsn: str, table: str, name: str) -> None:
    memory_id = ODD_IDS[name]
    model = Model()
    with PostgresChatMemoryStore(dsn, table=table) as store:
        bot = service(store, model)
        assert bot.chat(memory_id, "hi") == "answer to hi"
        assert len(model.requests) == 1
        assert texts(store.get_messages(memory_id)) == ["hi", "answer to hi"]
        assert list(store.memory_ids()) == [memory_id]


# -- tables written by the previous schema -----------------------------------------------------


def test_version_1_tables_are_upgraded_and_long_keys_refiled(dsn: str, table: str) -> None:
    # Version 1 filed every key as it is: a long key that compressed well was indexed, and
    # must be found under its digest after the upgrade.
    long_key = "ab" * 5_000
    with PostgresChatMemoryStore(dsn, table=table) as old:
        old.update_messages("short", [user("s")])
    conversations = sql.Identifier(f"{table}_conversations")
    with psycopg.connect(dsn, autocommit=True) as raw:
        raw.execute(sql.SQL("ALTER TABLE {} DROP COLUMN full_key").format(conversations))
        raw.execute(
            sql.SQL("UPDATE {} SET value = '1' WHERE name = 'version'").format(
                sql.Identifier(f"{table}_schema")
            )
        )
        raw.execute(
            sql.SQL("INSERT INTO {} (memory_key, last_seq) VALUES (%s, 1)").format(conversations),
            (long_key,),
        )
        raw.execute(
            sql.SQL(
                "INSERT INTO {} (memory_key, seq, message_id, message) VALUES (%s, 1, 'm', %s)"
            ).format(sql.Identifier(table)),
            (long_key, '{"type":"user","text":"old","message_id":"m"}'),
        )
    with PostgresChatMemoryStore(dsn, table=table) as store:
        assert texts(store.get_messages(long_key)) == ["old"]
        assert sorted(store.memory_ids()) == sorted([long_key, "short"])
        store.apply_changes(long_key, appended=[user("new")], removed=[])
        assert texts(store.get_messages(long_key)) == ["old", "new"]
    with psycopg.connect(dsn) as raw:
        version = raw.execute(
            sql.SQL("SELECT value FROM {} WHERE name = 'version'").format(
                sql.Identifier(f"{table}_schema")
            )
        ).fetchone()
        assert version == (str(SCHEMA_VERSION),)


def test_an_upgrade_a_role_may_not_make_says_how_to_make_it(dsn: str, table: str) -> None:
    role = f"r_{uuid.uuid4().hex[:12]}"
    with PostgresChatMemoryStore(dsn, table=table) as old:
        old.create_schema()
    names = [table, f"{table}_history", f"{table}_conversations", f"{table}_schema"]
    with psycopg.connect(dsn, autocommit=True) as raw:
        raw.execute(
            sql.SQL("ALTER TABLE {} DROP COLUMN full_key").format(
                sql.Identifier(f"{table}_conversations")
            )
        )
        raw.execute(
            sql.SQL("UPDATE {} SET value = '1' WHERE name = 'version'").format(
                sql.Identifier(f"{table}_schema")
            )
        )
        raw.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        try:
            raw.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                    sql.SQL(", ").join(sql.Identifier(n) for n in names), sql.Identifier(role)
                )
            )
            limited = f"{dsn} user={role}"
            with (
                PostgresChatMemoryStore(limited, table=table) as store,
                pytest.raises(StoreSchemaError, match=r"create_schema\(\) once as a role that may"),
            ):
                store.get_messages("c")
        finally:
            raw.execute(
                sql.SQL("REVOKE ALL ON {} FROM {}").format(
                    sql.SQL(", ").join(sql.Identifier(n) for n in names), sql.Identifier(role)
                )
            )
            raw.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
