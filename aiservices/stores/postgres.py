"""A store in a PostgreSQL database: one row per message, safe across processes and machines.

Schema (``table`` defaults to ``aiservices_messages``)::

    {table}                the window: one row per message a memory holds
        memory_key   text         store_key(memory_id)
        seq          bigint       position in the conversation; PRIMARY KEY (memory_key, seq)
        message_id   text         unique per conversation (UNIQUE {table}_message_id)
        turn_id      text         the message's turn_id, for queries
        created_at   timestamptz  the message's created_at (naive times read as UTC)
        stored_at    timestamptz  when the row was written
        message      text         the message as messages.message_to_json writes it
    {table}_history        the same columns plus evicted_at (timestamptz): rows that left
                           the window of a store opened with keep_history=True
    {table}_conversations  memory_key (PRIMARY KEY) and last_seq, the last sequence number
                           given out: its row is the lock a conversation's writers queue on
    {table}_schema         name/value pairs; 'version' is the schema version

With ``retention`` (a ``timedelta``), a turn's write deletes now and then (every tenth of
the period, at most hourly) the conversations idle for longer: see :meth:`purge_idle`.

A turn's write (``apply_changes``) is one statement, so one round trip: it takes the
sequence numbers it appends from the conversation's row in ``{table}_conversations``,
which locks that row until the statement commits, deletes the removed rows by message id
(moving them to history with keep_history) and inserts the new ones. Writers of one
conversation, in any thread, task, process or machine, queue on that row, so sequence
numbers follow the order of commit; a removal of a row that another writer is changing
waits for it and then applies to what it committed. No writer re-inserts a message that
is stored (``update_messages`` renumbers and edits rows in place), so a removal can't miss a
message by its id, and none loses another's messages. The other writes are transactions
that lock the same row first.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import select
import threading
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Generator,
    Hashable,
    Iterator,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Self, TypeAlias

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .._per_loop import PerLoop, close_in_loop
from ..messages import ChatMessage, message_to_json
from ._base import memory_id_of, store_key
from ._common import (
    CorruptMessageError,
    HistoryEntry,
    MessageCache,
    StoreSchemaError,
    WindowRead,
    appended_ids,
    check_retention,
    check_unique_ids,
    duplicate_id_error,
    plan_update,
    purge_interval,
    window_since,
    with_message_ids,
)

__all__ = ["SCHEMA_VERSION", "PostgresChatMemoryStore"]

_log = logging.getLogger("aiservices")

SCHEMA_VERSION: Final = 1
"""The schema this version writes; a database with a newer one is refused."""

_SUFFIXES = ("_history", "_conversations", "_schema", "_message_id")
_MAX_IDENTIFIER = 63  # PostgreSQL silently truncates longer names

_Rows: TypeAlias = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class _Query:
    """One statement of an operation; ``fetch``: the operation needs its rows."""

    sql: str
    params: Sequence[Any] = ()
    fetch: bool = False


# An operation is a generator: it yields the statements it needs, receives the rows of those
# it fetches, and returns its result. The sync and async drivers run the same operations.
_Op: TypeAlias = Generator[_Query, Any, Any]


class PostgresChatMemoryStore:
    """Keeps conversations in PostgreSQL tables, writing only what changed.

    ``dsn_or_pool`` is a libpq connection string or URL, a ``psycopg_pool.ConnectionPool``,
    or a ``psycopg.Connection``. From a DSN the store makes a pool of up to
    ``max_connections`` connections, opened on first use, and in each event loop that calls
    its async methods an ``AsyncConnectionPool``; ``timeout`` is how many seconds a call
    waits for a connection from them. Given a pool or connection, async calls use
    ``async_pool`` if given, else run the sync methods in a worker thread. A connection
    passed in is used by one call at a time, as is: with autocommit off, writes join any
    transaction open on it. What the store made, :meth:`close` (or :meth:`aclose`) closes.

    The tables are created on first use, or by :meth:`create_schema`. With
    ``keep_history=True``, messages leaving the window move to the history table instead of
    being deleted; :meth:`get_history` reads the whole transcript and :meth:`forget` erases
    it. Errors are psycopg's own: ``psycopg.OperationalError`` when the server is lost
    (``psycopg_pool.PoolTimeout``, a subclass, when no connection came within ``timeout``).
    A pooled connection that the server closed while it sat idle, as when the server
    restarted, is replaced before a call gets it.
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool[Any] | psycopg.Connection[Any],
        *,
        table: str = "aiservices_messages",
        keep_history: bool = False,
        async_pool: AsyncConnectionPool[Any] | None = None,
        max_connections: int = 10,
        timeout: float = 30.0,
        retention: timedelta | None = None,
    ) -> None:
        if not isinstance(table, str) or not table:
            raise ValueError(f"table must be a non-empty str, got {table!r}")
        longest = len(table.encode()) + max(len(s) for s in _SUFFIXES)
        if longest > _MAX_IDENTIFIER:
            raise ValueError(
                f"table {table!r} is too long: with the suffix {'_conversations'!r} a name "
                f"must fit PostgreSQL's {_MAX_IDENTIFIER} bytes"
            )
        if "\x00" in table:
            raise ValueError(f"table {table!r} has a NUL character, which PostgreSQL refuses")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.table = table
        self.keep_history = bool(keep_history)
        self.retention = check_retention(retention)
        self._next_purge = (
            float("inf")
            if self.retention is None
            else time.monotonic() + purge_interval(self.retention)
        )
        self._dsn: str | None = None
        self._given = type(dsn_or_pool).__name__
        self._max_connections = max_connections
        self._timeout = timeout
        self._source: _Source
        if isinstance(dsn_or_pool, str):
            self._dsn = dsn_or_pool
            self._source = _OwnPool(dsn_or_pool, max_connections, timeout)
        elif isinstance(dsn_or_pool, ConnectionPool):
            self._source = _GivenPool(dsn_or_pool)
        elif isinstance(dsn_or_pool, psycopg.Connection):
            self._source = _GivenConnection(dsn_or_pool)
        else:
            raise TypeError(
                "dsn_or_pool must be a connection string, a psycopg_pool.ConnectionPool or a "
                f"psycopg.Connection, not {type(dsn_or_pool).__name__}"
            )
        self._async_pool = async_pool
        self._loop_pools: PerLoop[AsyncConnectionPool[Any]] = PerLoop()
        self._sql = _Statements(table)
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._cache = MessageCache()

    def __repr__(self) -> str:
        where = f"<{self._given}>" if self._dsn is None else repr(_redact(self._dsn))
        return (
            f"{type(self).__name__}({where}, table={self.table!r}, "
            f"keep_history={self.keep_history!r})"
        )

    # -- schema --------------------------------------------------------------------------

    def create_schema(self) -> None:
        """Create the tables if they are missing, and check their schema version.

        Calls do this on first use; call it to fail early, or to create the tables with
        a role that may, before handing the database to one that may only write rows.
        """
        self._run(self._schema_op(), transaction=True, check_schema=False)
        self._schema_ready = True

    async def acreate_schema(self) -> None:
        """:meth:`create_schema` for async callers."""
        await self._arun(self._schema_op(), transaction=True, check_schema=False)
        self._schema_ready = True

    def _schema_op(self) -> _Op:
        s = self._sql
        yield _Query(s.schema_lock, (s.lock_key,))
        ((schema_table, table),) = yield _Query(
            s.find_tables, (s.names["schema"], s.names["table"]), fetch=True
        )
        if schema_table is None:
            if table is not None:
                raise StoreSchemaError(
                    f"table {self.table!r} exists but was not made by aiservices; pass another "
                    "table= name"
                )
            for statement in s.create:
                yield _Query(statement)
            yield _Query(s.set_version, (str(SCHEMA_VERSION),))
            return
        rows = yield _Query(s.get_version, fetch=True)
        if not rows:
            raise StoreSchemaError(f"table {s.names['schema']!r} holds no schema version")
        try:
            version = int(rows[0][0])
        except ValueError:
            raise StoreSchemaError(
                f"table {s.names['schema']!r} holds a schema version that is not a number: "
                f"{rows[0][0]!r}"
            ) from None
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"table {self.table!r} has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this version of aiservices reads; upgrade aiservices"
            )
        if version < SCHEMA_VERSION:
            raise StoreSchemaError(f"table {self.table!r} has unknown schema version {version}")

    # -- the store protocol --------------------------------------------------------------

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The messages in the window, oldest first; ``[]`` for an unknown id."""
        rows = self._run(self._read_op(memory_id), transaction=False)
        return self._parse(memory_id, rows) if rows else []

    def get_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """The window, and what to pass as ``since`` to the next read of it.

        Messages an earlier read returned (``since`` is what it returned beside them) are
        reused rather than parsed again: only rows newer than that read are fetched whole.
        """
        rows = self._run(self._since_op(memory_id, since), transaction=False)
        read = window_since(rows, since, self._parser(memory_id, rows))
        if read is None:
            rows = self._run(self._since_op(memory_id, None), transaction=False)
            read = window_since(rows, None, self._parser(memory_id, rows))
            assert read is not None  # every row has its text
        return read

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None:
        """In one statement, remove the messages whose id is in ``removed`` (moving them to
        history with ``keep_history``), then append ``appended`` after every stored message."""
        op, texts = self._apply_op(memory_id, appended, removed)
        try:
            self._run(op, transaction=False)
        except psycopg.errors.UniqueViolation as exc:
            self._check_duplicate(exc)
            raise self._duplicate(memory_id, appended, removed) from None
        self._cache.remember(texts, appended)
        if time.monotonic() >= self._next_purge:
            self._purge_by_retention()

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the window equal to ``messages``, writing only the difference.

        Stored messages missing from ``messages`` are removed (to history with
        ``keep_history``) and new ones appended. If the messages kept would change order, or
        a new one goes before one kept, the window's rows are written again.
        """
        op, new, texts = self._update_op(memory_id, messages)
        self._run(op, transaction=True)
        self._cache.remember(texts, new)

    def delete_messages(self, memory_id: Hashable) -> None:
        """Empty the window; with ``keep_history`` its messages stay in history, evicted."""
        self._run(self._delete_op(memory_id), transaction=True)

    def get_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """Every message kept for ``memory_id``, in order: the history, then the window.

        Each entry's ``evicted_at`` says when it left the window (``None``: still in it).
        Without ``keep_history`` evicted messages are deleted, so only the window and any
        history written earlier by a store with ``keep_history`` remain.
        """
        rows = self._run(self._history_op(memory_id), transaction=False)
        return self._history(memory_id, rows)

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation's window and history."""
        self._run(self._forget_op(memory_id), transaction=True)

    def purge_idle(self, older_than: timedelta) -> int:
        """Delete every conversation idle for longer than ``older_than``; return how many.

        A conversation is idle since its last write: the newest message stored, or the
        newest eviction into history. Its window, history and counter go, as with
        :meth:`forget`; a conversation a writer holds at that moment is left for the next
        purge. One transaction at ``REPEATABLE READ``: a write that lands while it runs
        makes it fail with ``psycopg.errors.SerializationFailure`` rather than erase what
        was just written (the periodic purge logs that and tries again next interval). It
        reads every row's time, so run it now and then.
        """
        return int(self._run(self._purge_op(older_than), transaction=True))

    async def apurge_idle(self, older_than: timedelta) -> int:
        """:meth:`purge_idle` for async callers."""
        return int(await self._arun(self._purge_op(older_than), transaction=True))

    def _purge_op(self, older_than: timedelta) -> _Op:
        cutoff = _cutoff(older_than)
        yield _Query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rows = yield _Query(self._sql.purge, (cutoff, cutoff), fetch=True)
        return rows[0][0]

    def _purge_by_retention(self) -> None:
        retention = self.retention
        assert retention is not None
        self._next_purge = time.monotonic() + purge_interval(retention)
        try:
            self.purge_idle(retention)
        except psycopg.Error as error:
            # The write that got here has committed; a purge is housekeeping that the next
            # interval retries, and must not make the caller believe its write failed.
            _log.warning("%r: purging idle conversations failed: %s", self, error)

    async def _apurge_by_retention(self) -> None:
        retention = self.retention
        assert retention is not None
        self._next_purge = time.monotonic() + purge_interval(retention)
        try:
            await self.apurge_idle(retention)
        except psycopg.Error as error:
            _log.warning("%r: purging idle conversations failed: %s", self, error)

    def memory_ids(self) -> Iterator[Hashable]:
        """The ids of the conversations this store holds, each as it was given."""
        rows = self._run(_single(_Query(self._sql.keys, (), fetch=True)), transaction=False)
        return map(memory_id_of, [key for (key,) in rows])

    # -- async twins ---------------------------------------------------------------------

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """:meth:`get_messages` for async callers."""
        rows = await self._arun(self._read_op(memory_id), transaction=False)
        return self._parse(memory_id, rows) if rows else []

    async def aget_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """:meth:`get_messages_since` for async callers."""
        rows = await self._arun(self._since_op(memory_id, since), transaction=False)
        read = window_since(rows, since, self._parser(memory_id, rows))
        if read is None:
            rows = await self._arun(self._since_op(memory_id, None), transaction=False)
            read = window_since(rows, None, self._parser(memory_id, rows))
            assert read is not None  # every row has its text
        return read

    async def aapply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None:
        """:meth:`apply_changes` for async callers."""
        op, texts = self._apply_op(memory_id, appended, removed)
        try:
            await self._arun(op, transaction=False)
        except psycopg.errors.UniqueViolation as exc:
            self._check_duplicate(exc)
            raise self._duplicate(memory_id, appended, removed) from None
        self._cache.remember(texts, appended)
        if time.monotonic() >= self._next_purge:
            await self._apurge_by_retention()

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """:meth:`update_messages` for async callers."""
        op, new, texts = self._update_op(memory_id, messages)
        await self._arun(op, transaction=True)
        self._cache.remember(texts, new)

    async def adelete_messages(self, memory_id: Hashable) -> None:
        """:meth:`delete_messages` for async callers."""
        await self._arun(self._delete_op(memory_id), transaction=True)

    async def aget_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """:meth:`get_history` for async callers."""
        rows = await self._arun(self._history_op(memory_id), transaction=False)
        return self._history(memory_id, rows)

    async def aforget(self, memory_id: Hashable) -> None:
        """:meth:`forget` for async callers."""
        await self._arun(self._forget_op(memory_id), transaction=True)

    # -- operations ----------------------------------------------------------------------

    def _read_op(self, memory_id: Hashable) -> _Op:
        key = store_key(memory_id)
        return (yield _Query(self._sql.read, (key,), fetch=True))

    def _since_op(self, memory_id: Hashable, since: object) -> _Op:
        after = since.after if isinstance(since, WindowRead) else -1
        return (yield _Query(self._sql.read_since, (after, store_key(memory_id)), fetch=True))

    def _history_op(self, memory_id: Hashable) -> _Op:
        key = store_key(memory_id)
        return (yield _Query(self._sql.read_history, (key, key), fetch=True))

    def _apply_op(
        self, memory_id: Hashable, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> tuple[_Op, list[str]]:
        appended_ids(appended)
        texts = [message_to_json(m) for m in appended]
        key = store_key(memory_id)
        s = self._sql
        history = self.keep_history
        n = len(appended)
        if appended and removed:
            statement = s.apply_evict if history else s.apply_delete
            query = _Query(statement, (key, n, key, list(removed), n, *_rows(appended, texts)))
        elif appended:
            query = _Query(s.apply_append, (key, n, n, *_rows(appended, texts)))
        elif removed:
            query = _Query(s.evict if history else s.delete_ids, (key, list(removed)))
        else:
            return _nothing(), texts
        return _single(query), texts

    def _update_op(
        self, memory_id: Hashable, messages: Sequence[ChatMessage]
    ) -> tuple[_Op, list[ChatMessage], list[str]]:
        new = with_message_ids(messages)
        check_unique_ids(new)
        texts = [message_to_json(m) for m in new]
        if not new:
            return self._delete_op(memory_id), new, texts
        key = store_key(memory_id)
        s = self._sql
        history = self.keep_history
        wanted = [(m.message_id, text) for m, text in zip(new, texts, strict=True)]

        def op() -> _Op:
            yield _Query(s.allocate, (key, 0))  # the lock, creating the conversation's row
            stored: _Rows = yield _Query(s.read_window, (key,), fetch=True)
            plan = plan_update(stored, wanted)
            if plan.removed:
                yield _Query(s.evict if history else s.delete_ids, (key, plan.removed))
            if plan.changed and history:
                yield _Query(s.copy_to_history, (key, plan.changed))
            # Rows are renumbered and edited in place, never deleted and inserted again: a
            # writer removing one by its id meanwhile finds it (it waits for this
            # transaction, then deletes what it committed).
            fresh = new[plan.fresh :]
            if not fresh:
                return
            staying = [*plan.staying, *plan.changed]
            ((last,),) = yield _Query(s.allocate_returning, (key, len(fresh)), fetch=True)
            seqs = list(range(last - len(fresh) + 1, last + 1))
            stored_ids = set(staying)
            moved = [i for i, m in enumerate(fresh) if m.message_id in stored_ids]
            if moved:
                first = len(new) - len(fresh)
                yield _Query(
                    s.renumber,
                    (
                        *_rows([fresh[i] for i in moved], [texts[first + i] for i in moved]),
                        [seqs[i] for i in moved],
                        key,
                    ),
                )
            added = [i for i, m in enumerate(fresh) if m.message_id not in stored_ids]
            if added:
                first = len(new) - len(fresh)
                yield _Query(
                    s.insert,
                    (
                        key,
                        *_rows([fresh[i] for i in added], [texts[first + i] for i in added]),
                        [seqs[i] for i in added],
                    ),
                )

        return op(), new, texts

    def _delete_op(self, memory_id: Hashable) -> _Op:
        key = store_key(memory_id)
        s = self._sql
        locked = yield _Query(s.lock, (key,), fetch=True)
        if not locked:
            return  # no conversation row: nothing stored
        if self.keep_history:
            yield _Query(s.evict_all, (key,))
        else:
            yield _Query(s.delete_all, (key,))
        # Sequence numbers must go on after any history; without history they may restart.
        yield _Query(s.drop_conversation_without_history, (key, key))

    def _forget_op(self, memory_id: Hashable) -> _Op:
        key = store_key(memory_id)
        s = self._sql
        yield _Query(s.lock, (key,))
        yield _Query(s.delete_all, (key,))
        yield _Query(s.forget_history, (key,))
        yield _Query(s.drop_conversation, (key,))

    # -- drivers -------------------------------------------------------------------------

    def _run(self, op: _Op, *, transaction: bool, check_schema: bool = True) -> Any:
        if check_schema and not self._schema_ready:
            with self._schema_lock:
                if not self._schema_ready:
                    self.create_schema()
        source = self._source
        with source.connection() as conn:
            try:
                return _drive(conn, op, transaction=transaction)
            except psycopg.OperationalError:
                if conn.closed:  # the connection broke, not just the statement
                    source.purge()
                raise

    async def _arun(self, op: _Op, *, transaction: bool, check_schema: bool = True) -> Any:
        pool = self._apool()
        if pool is None:
            return await asyncio.to_thread(
                self._run, op, transaction=transaction, check_schema=check_schema
            )
        if check_schema and not self._schema_ready:
            await self.acreate_schema()
        async with _aconnection(pool) as conn:
            try:
                return await _adrive(conn, op, transaction=transaction)
            except psycopg.OperationalError:
                if conn.closed:  # the connection broke, not just the statement
                    await pool.check()
                raise

    def _apool(self) -> AsyncConnectionPool[Any] | None:
        if self._async_pool is not None:
            return self._async_pool
        if self._dsn is None:
            return None
        dsn = self._dsn
        # An asyncio connection belongs to the event loop that opened it: one pool per loop.
        return self._loop_pools.get(
            lambda: AsyncConnectionPool(
                dsn,
                min_size=1,
                max_size=self._max_connections,
                kwargs={"autocommit": True},
                timeout=self._timeout,
                reconnect_timeout=self._timeout,
                check=_acheck_idle,
                open=False,
                name=f"aiservices:{self.table}:async",
            )
        )

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pools this store made (not a pool or connection passed in).

        An async pool is closed in its own event loop: at once if that loop is idle, soon if
        it is running; one whose loop has already closed can no longer be closed (call
        :meth:`aclose` in the loop before it ends).
        """
        for loop, pool in self._loop_pools.pop_all():
            close_in_loop(loop, pool.close)
        self._source.close()

    async def aclose(self) -> None:
        """Close the pools this store made, the current event loop's one awaited."""
        pool = self._loop_pools.pop()
        if pool is not None:
            await pool.close()
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- results -------------------------------------------------------------------------

    def _parser(self, memory_id: Hashable, rows: _Rows) -> Callable[[list[int]], list[ChatMessage]]:
        # rows: (seq, message_id, message)
        def parse(indexes: list[int]) -> list[ChatMessage]:
            return self._parse(memory_id, [(rows[i][0], rows[i][2]) for i in indexes])

        return parse

    def _parse(self, memory_id: Hashable, rows: _Rows) -> list[ChatMessage]:
        # rows: (seq, message, ...)
        def corrupt(i: int, reason: str) -> Exception:
            return _corrupt(memory_id, rows[i][0], reason, self.table)

        return self._cache.parse([row[1] for row in rows], corrupt)

    def _history(self, memory_id: Hashable, rows: _Rows) -> list[HistoryEntry]:
        if not rows:
            return []
        messages = self._parse(memory_id, rows)
        return [
            HistoryEntry(m, None if when is None else when.astimezone(UTC))
            for m, (_, _, when) in zip(messages, rows, strict=True)
        ]

    def _check_duplicate(self, exc: psycopg.errors.UniqueViolation) -> None:
        if exc.diag.constraint_name != self._sql.names["message_id"]:
            raise exc

    def _duplicate(
        self, memory_id: Hashable, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> ValueError:
        # The write was rolled back; find which appended id is stored, to name it.
        key = store_key(memory_id)
        ids = [m.message_id for m in appended]
        try:
            rows = self._run(
                _single(_Query(self._sql.find_ids, (key, ids), fetch=True)), transaction=False
            )
        except psycopg.Error:
            rows = []
        stored = {mid for (mid,) in rows} - set(removed)
        return duplicate_id_error(next((i for i in ids if i in stored), ids[0]), memory_id)


def _single(query: _Query) -> _Op:
    return (yield query)


def _nothing() -> _Op:
    return
    yield


def _rows(messages: Sequence[ChatMessage], texts: Sequence[str]) -> tuple[list[Any], ...]:
    """The columns of ``messages`` as arrays: message_id, turn_id, created_at, message."""
    created = [
        None
        if m.created_at is None
        else (m.created_at.replace(tzinfo=UTC) if m.created_at.tzinfo is None else m.created_at)
        for m in messages
    ]
    return [m.message_id for m in messages], [m.turn_id for m in messages], created, list(texts)


def _drive(conn: psycopg.Connection[Any], op: _Op, *, transaction: bool) -> Any:
    # On an autocommit connection a single statement is its own transaction; otherwise one
    # is opened and ended here, so that none is left open.
    if not transaction and conn.autocommit:
        return _steps(conn, op)
    with conn.transaction():
        return _steps(conn, op)


def _steps(conn: psycopg.Connection[Any], op: _Op) -> Any:
    rows: _Rows | None = None
    while True:
        try:
            query = op.send(rows)
        except StopIteration as stop:
            return stop.value
        cursor = conn.execute(query.sql, query.params)
        rows = cursor.fetchall() if query.fetch else None


async def _adrive(conn: psycopg.AsyncConnection[Any], op: _Op, *, transaction: bool) -> Any:
    if not transaction and conn.autocommit:
        return await _asteps(conn, op)
    async with conn.transaction():
        return await _asteps(conn, op)


async def _asteps(conn: psycopg.AsyncConnection[Any], op: _Op) -> Any:
    rows: _Rows | None = None
    while True:
        try:
            query = op.send(rows)
        except StopIteration as stop:
            return stop.value
        cursor = await conn.execute(query.sql, query.params)
        rows = await cursor.fetchall() if query.fetch else None


@asynccontextmanager
async def _aconnection(
    pool: AsyncConnectionPool[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    if pool.closed:
        await pool.open()  # a pool made for this loop, on its first call
    async with pool.connection() as conn:
        yield conn


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        return bool(poll.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


# An idle connection has nothing to read, unless its server closed it (or is closing it,
# saying why), as when the server restarted while the connection sat in the pool. Only
# then is the connection tested with a round trip, and replaced if it fails.
def _check_idle(conn: psycopg.Connection[Any]) -> None:
    if _readable(conn.fileno()):
        ConnectionPool.check_connection(conn)


async def _acheck_idle(conn: psycopg.AsyncConnection[Any]) -> None:
    if _readable(conn.fileno()):
        await AsyncConnectionPool.check_connection(conn)


class _Source:
    """Where the sync methods get a connection."""

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        raise NotImplementedError
        yield

    def purge(self) -> None:
        """A connection broke: drop the idle ones that broke with it."""

    def close(self) -> None:
        """Close what the store made."""


class _GivenPool(_Source):
    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self.pool.connection() as conn:
            yield conn

    def purge(self) -> None:
        self.pool.check()


class _OwnPool(_GivenPool):
    def __init__(self, dsn: str, max_connections: int, timeout: float) -> None:
        super().__init__(
            ConnectionPool(
                dsn,
                min_size=1,
                max_size=max_connections,
                kwargs={"autocommit": True},
                timeout=timeout,
                # Retrying a lost server in the background backs off (1 s, 2 s, 4 s...):
                # give up as soon as no call would still wait, and let the next call try
                # again at once.
                reconnect_timeout=timeout,
                check=_check_idle,
                open=False,
                name="aiservices",
            )
        )
        self._opened = False
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self.pool.open()  # connects in the background; calls wait for it
                    self._opened = True
        with self.pool.connection() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            self._opened = True  # a closed pool can't open again: calls now fail
            self.pool.close()


class _GivenConnection(_Source):
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self.lock:
            yield self.conn


class _Statements:
    # The SQL of one table, rendered once per store.
    def __init__(self, table: str) -> None:
        names = {
            "table": table,
            "history": f"{table}_history",
            "conversations": f"{table}_conversations",
            "schema": f"{table}_schema",
            "message_id": f"{table}_message_id",
        }
        self.names = names
        ids = {name: sql.Identifier(value) for name, value in names.items()}

        def render(template: str) -> str:
            return sql.SQL(template).format(**ids).as_string(None)

        # Concurrent first uses create the tables one at a time, under this lock.
        digest = hashlib.blake2b(f"aiservices schema {table}".encode(), digest_size=8).digest()
        self.lock_key = int.from_bytes(digest, "big", signed=True)
        self.schema_lock = "SELECT pg_advisory_xact_lock(%s)"
        self.find_tables = "SELECT to_regclass(quote_ident(%s)), to_regclass(quote_ident(%s))"
        self.get_version = render("SELECT value FROM {schema} WHERE name = 'version'")
        self.set_version = render("INSERT INTO {schema} (name, value) VALUES ('version', %s)")
        columns = """
            memory_key text NOT NULL,
            seq bigint NOT NULL,
            message_id text NOT NULL,
            turn_id text,
            created_at timestamptz,
            stored_at timestamptz NOT NULL DEFAULT now(),
            message text NOT NULL"""
        self.create = tuple(
            render(statement)
            for statement in (
                "CREATE TABLE {schema} (name text PRIMARY KEY, value text NOT NULL)",
                "CREATE TABLE {conversations} (memory_key text PRIMARY KEY, "
                "last_seq bigint NOT NULL)",
                f"CREATE TABLE {{table}} ({columns}, PRIMARY KEY (memory_key, seq), "
                "CONSTRAINT {message_id} UNIQUE (memory_key, message_id))",
                f"CREATE TABLE {{history}} ({columns}, evicted_at timestamptz NOT NULL, "
                "PRIMARY KEY (memory_key, seq))",
            )
        )
        self.read = render("SELECT seq, message FROM {table} WHERE memory_key = %s ORDER BY seq")
        # Rows at or below the first parameter were read before: their text is not sent.
        self.read_since = render(
            "SELECT seq, message_id, CASE WHEN seq > %s THEN message END FROM {table} "
            "WHERE memory_key = %s ORDER BY seq"
        )
        self.read_window = render(
            "SELECT message_id, message FROM {table} WHERE memory_key = %s ORDER BY seq"
        )
        self.read_history = render(
            "SELECT seq, message, evicted_at FROM {history} WHERE memory_key = %s "
            "UNION ALL SELECT seq, message, NULL FROM {table} WHERE memory_key = %s "
            "ORDER BY seq"
        )
        self.find_ids = render(
            "SELECT message_id FROM {table} WHERE memory_key = %s AND message_id = ANY(%s)"
        )
        all_columns = "memory_key, seq, message_id, turn_id, created_at, stored_at, message"
        new_rows = (
            "unnest(%s::text[], %s::text[], %s::timestamptz[], %s::text[]) "
            "WITH ORDINALITY AS u(message_id, turn_id, created_at, message, ord)"
        )
        # Taking sequence numbers locks the conversation's row until the transaction ends.
        allocate = (
            "INSERT INTO {conversations} AS c (memory_key, last_seq) VALUES (%s, %s) "
            "ON CONFLICT (memory_key) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq"
        )
        self.allocate = render(allocate)
        self.allocate_returning = render(f"{allocate} RETURNING last_seq")
        self.lock = render("SELECT last_seq FROM {conversations} WHERE memory_key = %s FOR UPDATE")
        # A turn: take numbers, then insert after them. With removals, the deletions run
        # first (the count in the WHERE makes the insert wait for them), so a message may be
        # removed and appended again in one call.
        take = f"c AS ({allocate} RETURNING memory_key, last_seq)"
        append = (
            "INSERT INTO {table} (memory_key, seq, message_id, turn_id, created_at, message) "
            "SELECT c.memory_key, c.last_seq - %s + u.ord, u.message_id, u.turn_id, "
            f"u.created_at, u.message FROM c, {new_rows}"
        )
        after_gone = " WHERE (SELECT count(*) FROM gone) >= 0"
        delete_ids = "DELETE FROM {table} WHERE memory_key = %s AND message_id = ANY(%s)"
        to_history = (
            f"INSERT INTO {{history}} ({all_columns}, evicted_at) "
            f"SELECT {all_columns}, clock_timestamp() FROM gone"
        )
        self.apply_append = render(f"WITH {take} {append}")
        self.apply_delete = render(
            f"WITH {take}, gone AS ({delete_ids} RETURNING 1) {append}{after_gone}"
        )
        self.apply_evict = render(
            f"WITH {take}, gone AS ({delete_ids} RETURNING {all_columns}), "
            f"moved AS ({to_history}) {append}{after_gone}"
        )
        self.delete_ids = render(delete_ids)
        self.evict = render(f"WITH gone AS ({delete_ids} RETURNING {all_columns}) {to_history}")
        self.copy_to_history = render(
            f"INSERT INTO {{history}} ({all_columns}, evicted_at) "
            f"SELECT {all_columns}, clock_timestamp() FROM {{table}} "
            "WHERE memory_key = %s AND message_id = ANY(%s)"
        )
        numbered_rows = (
            "unnest(%s::text[], %s::text[], %s::timestamptz[], %s::text[], %s::bigint[]) "
            "AS u(message_id, turn_id, created_at, message, seq)"
        )
        self.insert = render(
            "INSERT INTO {table} (memory_key, seq, message_id, turn_id, created_at, message) "
            "SELECT %s, u.seq, u.message_id, u.turn_id, u.created_at, u.message "
            f"FROM {numbered_rows}"
        )
        self.renumber = render(
            "UPDATE {table} AS t SET seq = u.seq, turn_id = u.turn_id, "
            "created_at = u.created_at, message = u.message, "
            "stored_at = CASE WHEN t.message = u.message THEN t.stored_at ELSE now() END "
            f"FROM {numbered_rows} WHERE t.memory_key = %s AND t.message_id = u.message_id"
        )
        self.delete_all = render("DELETE FROM {table} WHERE memory_key = %s")
        self.evict_all = render(
            f"WITH gone AS (DELETE FROM {{table}} WHERE memory_key = %s RETURNING {all_columns}) "
            f"INSERT INTO {{history}} ({all_columns}, evicted_at) "
            f"SELECT {all_columns}, clock_timestamp() FROM gone"
        )
        self.forget_history = render("DELETE FROM {history} WHERE memory_key = %s")
        self.drop_conversation = render("DELETE FROM {conversations} WHERE memory_key = %s")
        self.keys = render("SELECT memory_key FROM {conversations}")
        # Idle: no window row stored and no history row evicted since the cutoff. A row a
        # writer has locked is skipped, and purged next time.
        self.purge = render(
            "WITH idle AS (SELECT c.memory_key FROM {conversations} c "
            "WHERE NOT EXISTS (SELECT 1 FROM {table} t "
            "WHERE t.memory_key = c.memory_key AND t.stored_at >= %s) "
            "AND NOT EXISTS (SELECT 1 FROM {history} h "
            "WHERE h.memory_key = c.memory_key AND h.evicted_at >= %s) "
            "FOR UPDATE OF c SKIP LOCKED), "
            "window_rows AS (DELETE FROM {table} WHERE memory_key IN "
            "(SELECT memory_key FROM idle)), "
            "history_rows AS (DELETE FROM {history} WHERE memory_key IN "
            "(SELECT memory_key FROM idle)), "
            "gone AS (DELETE FROM {conversations} WHERE memory_key IN "
            "(SELECT memory_key FROM idle) RETURNING 1) "
            "SELECT count(*) FROM gone"
        )
        self.drop_conversation_without_history = render(
            "DELETE FROM {conversations} WHERE memory_key = %s "
            "AND NOT EXISTS (SELECT 1 FROM {history} WHERE memory_key = %s)"
        )


def _cutoff(older_than: timedelta) -> datetime:
    if not isinstance(older_than, timedelta):
        raise TypeError(f"older_than must be a timedelta, got {type(older_than).__name__}")
    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, got {older_than!r}")
    return datetime.now(UTC) - older_than


def _redact(dsn: str) -> str:
    # A password in the DSN never reaches a repr.
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<dsn>"
    if "password" in params:
        params["password"] = "***"
    return " ".join(f"{k}={v}" for k, v in params.items())


def _corrupt(memory_id: Hashable, seq: object, reason: str, table: str) -> CorruptMessageError:
    return CorruptMessageError(
        memory_id,
        seq,
        reason,
        hint=(
            f"repair or delete the row with memory_key = {store_key(memory_id)!r} and "
            f"seq = {seq} in table {table!r} (or {table}_history)"
        ),
    )
