"""A store in a PostgreSQL database: one row per message, safe across processes and machines.

Schema (``table`` defaults to ``aiservices_messages``)::

    {table}                the window: one row per message a memory holds
        memory_key   text         the conversation's key (see below)
        seq          bigint       position in the conversation; PRIMARY KEY (memory_key, seq)
        message_id   text         unique per conversation (UNIQUE {table}_message_id)
        turn_id      text         the message's turn_id, for queries
        created_at   timestamptz  the message's created_at (naive times read as UTC)
        stored_at    timestamptz  when the row was written
        message      text         the message as messages.message_to_json writes it
    {table}_history        the same columns plus evicted_at (timestamptz): rows that left
                           the window of a store opened with keep_history=True
    {table}_conversations  memory_key (PRIMARY KEY); last_seq, the last sequence number
                           given out (its row is the lock a conversation's writers queue
                           on); full_key (bytea), the key in full where memory_key is its
                           digest
    {table}_schema         name/value pairs; 'version' is the schema version

A conversation's key is ``store_key(memory_id)`` where PostgreSQL can index and store it as
it is: at most ``MAX_KEY_BYTES`` bytes of UTF-8, with no NUL character and no lone
surrogate. Any other key is filed as ``"\\x1f#"`` and the SHA-256 of its UTF-8 in hex (lone
surrogates encoded as Python's ``surrogatepass`` does), and kept whole in ``full_key``: ids
stay distinct, and `memory_ids` lists them as given. Version 1 of the schema had no
``full_key``; the first use by this version adds it and refiles the keys that are now
digests (see `PostgresChatMemoryStore.create_schema`).

With ``retention`` (a ``timedelta``), a turn's write deletes the conversations idle for
longer: the store's first, then one every tenth of the period (at most hourly); see
`purge_idle`.

A turn's write (``apply_changes``) is one statement, sent with its BEGIN in one round trip
and committed in a second once its result is in (so that a statement the server runs only
after the call gave up is rolled back, never committed behind the caller's back). It takes
the sequence numbers it appends from the conversation's row in ``{table}_conversations``,
which locks that row until the statement commits, deletes the removed rows by message id
(moving them to history with keep_history) and inserts the new ones. Writers of one
conversation, in any thread, task, process or machine, queue on that row, so sequence
numbers follow the order of commit; a removal of a row that another writer is changing
waits for it and then applies to what it committed. No writer re-inserts a message that
is stored (``update_messages`` renumbers and edits rows in place), so a removal can't miss a
message by its id, and none loses another's messages. The other writes are transactions
that lock the same row first.

A read's ``since`` carries the conversation's ``last_seq`` (-1: no row), and a checked write
(``apply_changes(..., since=)``) takes its numbers only if the row's ``last_seq`` is still
that one (none still missing, for -1), a condition PostgreSQL evaluates on the row's newest
version once it holds the lock; emptying a window with ``keep_history`` raises ``last_seq``,
and emptying it otherwise, or `forget`, drops the row, so no write planned before passes.

Every wait is bounded. The server cancels a statement after ``statement_timeout`` and a lock
wait after ``lock_timeout`` (set on each connection the store opens). On the client, a call
gives up ``timeout`` seconds after it started, whether it is waiting for a connection or for
the server's answer: a watchdog thread shuts the socket of a call past its deadline down,
which wakes the call even when the server is frozen and the kernel still acknowledges what
it is sent. A connection is opened within ``connect_timeout``; when the last attempt to
connect failed, a call tries the server itself instead of waiting for the pool's next
attempt, so a server that is down fails a call at once, saying why.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import select
import socket
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
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Self, TypeAlias

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout

from .._per_loop import PerLoop, close_in_loop
from ..messages import ChatMessage, message_to_json
from ._base import ConcurrentChangeError, memory_id_of, store_key
from ._common import (
    CorruptMessageError,
    HistoryEntry,
    MessageCache,
    StoreSchemaError,
    WindowRead,
    appended_ids,
    check_retention,
    check_seconds,
    check_unique_ids,
    duplicate_id_error,
    plan_update,
    purge_interval,
    thread_call,
    window_since,
    with_message_ids,
)

__all__ = ["MAX_KEY_BYTES", "SCHEMA_VERSION", "PostgresChatMemoryStore"]

_log = logging.getLogger("aiservices")

SCHEMA_VERSION: Final = 2
"""The schema this version writes; a database with a newer one is refused, version 1 upgraded."""

MAX_KEY_BYTES: Final = 1024
"""The longest key, in bytes of UTF-8, filed as it is; a longer one is filed as its digest.

A btree index entry must fit in about 2,700 bytes after compression, beside the row's
message id: 1,024 leaves room for any id a caller would write by hand, and for a message id
of more than a kilobyte too.
"""

# No store_key starts so: in one, "\x1f" is followed by "\x1f" or a type name.
_DIGEST_PREFIX: Final = "\x1f#"
_SHORT_KEY = MAX_KEY_BYTES // 4  # a key of so many characters is at most MAX_KEY_BYTES of UTF-8

_SUFFIXES = ("_history", "_conversations", "_schema", "_message_id")
_MAX_IDENTIFIER = 63  # PostgreSQL silently truncates longer names

_GRACE = 0.25
"""Seconds a call waits for the pool before asking whether the server refused it."""

_RECONNECT = 1.0
"""Seconds the pool tries to connect again in the background; then the next call tries."""

# Defaults for the DSN's TCP settings, where it sets none: an idle pooled connection to a
# host that vanished is found dead in about a minute, not after the kernel's two hours.
_TCP_DEFAULTS: Final = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}

_Rows: TypeAlias = list[tuple[Any, ...]]
_Key: TypeAlias = tuple[str, bytes | None]  # the key filed, and the full key if it is a digest


def _file_key(memory_id: Hashable) -> _Key:
    """The key ``memory_id`` is filed under here, and the full key beside it if that is a digest."""
    return _file(store_key(memory_id))


def _file(key: str) -> _Key:
    """How a key (a `store_key`) is filed: itself, or its digest and the key in full."""
    if len(key) <= _SHORT_KEY and key.isascii() and "\x00" not in key:
        return key, None  # nearly every id: short ASCII
    try:
        full = key.encode()
    except UnicodeEncodeError:  # a lone surrogate, which UTF-8 can't carry
        full = key.encode("utf-8", "surrogatepass")
    else:
        if len(full) <= MAX_KEY_BYTES and "\x00" not in key:
            return key, None
    return _digest_key(full), full


def _digest_key(full: bytes) -> str:
    return _DIGEST_PREFIX + hashlib.sha256(full).hexdigest()


def _key_of(key: str, full: bytes | None) -> str:
    """The key a conversation was filed under, whole again."""
    return key if full is None else bytes(full).decode("utf-8", "surrogatepass")


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
    its async methods an ``AsyncConnectionPool``. Given a pool or connection, async calls use
    ``async_pool`` if given, else run the sync methods in a worker thread (a caller cancelled
    meanwhile is told so once the call has ended). A connection passed in is used by one
    call at a time, as is: with autocommit off, writes join any transaction open on it. What
    the store made, `close` (or `aclose`) closes. A DSN that libpq can't parse is a
    ``psycopg.ProgrammingError`` when the store is made.

    Waits are bounded. ``timeout`` is how many seconds a call may take, waiting for a
    connection and then for the server's answers, before it raises
    ``psycopg.OperationalError`` naming the server (``psycopg_pool.PoolTimeout``, a subclass,
    when no connection came free); it applies to connections and pools passed in too. The
    store's own connections are opened within ``connect_timeout`` seconds (libpq's, in whole
    seconds, at least 2), and the server cancels their statements after
    ``statement_timeout`` and their lock waits after ``lock_timeout`` seconds (``None``:
    the server's setting). When the server refused or ignored the last attempt to connect,
    a call tries it once itself rather than wait, and raises at once if it still fails.

    The tables are created on first use, or by `create_schema`. With
    ``keep_history=True``, messages leaving the window move to the history table instead of
    being deleted; `get_history` reads the whole transcript and `forget` erases
    it. Errors are psycopg's own. A pooled connection that the server closed while it sat
    idle, as when the server restarted, is replaced before a call gets it, without a pause.
    Once a store made from a DSN is closed, its calls raise ``psycopg_pool.PoolClosed``.
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool[Any] | psycopg.Connection[Any],
        *,
        table: str = "aiservices_messages",
        keep_history: bool = False,
        async_pool: AsyncConnectionPool[Any] | None = None,
        max_connections: int = 10,
        timeout: float = 15.0,
        connect_timeout: float = 5.0,
        statement_timeout: float | None = 10.0,
        lock_timeout: float | None = 5.0,
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
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise TypeError(
                f"max_connections must be a whole number >= 1, not "
                f"{type(max_connections).__name__} {max_connections!r}"
            )
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
        check_seconds("timeout", timeout)
        check_seconds("connect_timeout", connect_timeout)
        for name, value in (
            ("statement_timeout", statement_timeout),
            ("lock_timeout", lock_timeout),
        ):
            check_seconds(name, value, none="the server's own setting")
        self.table = table
        self.keep_history = bool(keep_history)
        self.retention = check_retention(retention)
        # The first write purges (a process may not live a tenth of the period), then
        # every tenth of it. Opening the store does no I/O: its first use connects.
        self._next_purge = float("inf") if self.retention is None else 0.0
        self._dsn: str | None = None
        self._given = type(dsn_or_pool).__name__
        self._max_connections = max_connections
        self._timeout = float(timeout)
        self._connector: _Connector | None = None
        self._source: _Source
        if isinstance(dsn_or_pool, str):
            _check_dsn(dsn_or_pool, "the DSN")
            self._dsn = dsn_or_pool
            self._connector = _Connector(
                dsn_or_pool,
                timeout=self._timeout,
                connect_timeout=connect_timeout,
                settings={"statement_timeout": statement_timeout, "lock_timeout": lock_timeout},
            )
            self._source = _OwnPool(self._connector, max_connections, self._timeout)
        elif isinstance(dsn_or_pool, ConnectionPool):
            if isinstance(dsn_or_pool.conninfo, str):
                # The pool would retry it in the background, and every call time out.
                _check_dsn(dsn_or_pool.conninfo, "the conninfo of the pool")
            self._source = _GivenPool(dsn_or_pool, self._timeout)
        elif isinstance(dsn_or_pool, psycopg.Connection):
            self._source = _GivenConnection(dsn_or_pool, self._timeout)
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

    def check_memory_id(self, memory_id: Hashable) -> None:
        """Raise ``ValueError`` if this store can't hold ``memory_id``; it does no I/O.

        Every id `aiservices.stores.store_key` files is held: a key PostgreSQL can't
        index or store as it is (long, or with a NUL or a lone surrogate) is filed as its
        digest, with the whole key beside it.
        """
        _file_key(memory_id)

    # -- schema --------------------------------------------------------------------------

    def create_schema(self) -> None:
        """Create the tables if they are missing, or upgrade them, and check their version.

        Calls do this on first use; call it to fail early, or to create (or upgrade) the
        tables with a role that may, before handing the database to one that may only write
        rows. Tables of schema version 1 gain the column ``full_key`` in
        ``{table}_conversations``, and their conversations whose key is now a digest are
        refiled under it, in one transaction.
        """
        try:
            refiled = self._run(self._schema_op(), transaction=True, check_schema=False)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise self._privilege_error(exc) from exc
        self._schema_ready = True
        self._log_upgrade(refiled)

    async def acreate_schema(self) -> None:
        """`create_schema` for async callers."""
        try:
            refiled = await self._arun(self._schema_op(), transaction=True, check_schema=False)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise self._privilege_error(exc) from exc
        self._schema_ready = True
        self._log_upgrade(refiled)

    def _log_upgrade(self, refiled: int | None) -> None:
        if refiled is not None:
            _log.info(
                "%r: upgraded the tables from schema version 1 to %d, refiling %d "
                "conversations under the digest of their key",
                self,
                SCHEMA_VERSION,
                refiled,
            )

    def _privilege_error(self, exc: psycopg.Error) -> StoreSchemaError:
        return StoreSchemaError(
            f"the tables of {self.table!r} can't be created or upgraded to schema version "
            f"{SCHEMA_VERSION} by this role ({_one_line(exc)}); call "
            "store.create_schema() once as a role that may (the tables' owner), then use them "
            "with this one"
        )

    def _schema_op(self) -> _Op:
        # Returns how many conversations an upgrade from version 1 refiled, else None.
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
        if version == 1:
            return (yield from self._upgrade_from_1())
        if version < SCHEMA_VERSION:
            raise StoreSchemaError(f"table {self.table!r} has unknown schema version {version}")

    def _upgrade_from_1(self) -> _Op:
        # Version 1 filed every key as it is, so its tables may hold keys that are digests
        # now (long ones that compressed well enough to be indexed): refile those, so that
        # their conversations are found under the key this version looks them up by.
        s = self._sql
        yield _Query(s.add_full_key)
        rows = yield _Query(s.long_keys, (_SHORT_KEY,), fetch=True)
        old: list[str] = []
        new: list[str] = []
        full: list[bytes] = []
        for (key,) in rows:
            filed, whole = _file(key)
            if whole is not None:
                old.append(key)
                new.append(filed)
                full.append(whole)
        if old:
            yield _Query(s.rekey_conversations, (old, new, full))
            yield _Query(s.rekey_window, (old, new))
            yield _Query(s.rekey_history, (old, new))
        yield _Query(s.update_version, (str(SCHEMA_VERSION),))
        return len(old)

    # -- the store protocol --------------------------------------------------------------

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The messages in the window, oldest first; ``[]`` for an unknown id."""
        rows = self._run(self._read_op(memory_id), transaction=False)
        return self._parse(memory_id, rows) if rows else []

    def get_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """The window, and what to pass as ``since`` to the next read of it or to a checked
        `apply_changes`.

        Messages an earlier read returned (``since`` is what it returned beside them) are
        reused rather than parsed again: only rows newer than that read are fetched whole.
        """
        rows = self._run(self._since_op(memory_id, since), transaction=False)
        read = self._window(memory_id, since, rows)
        if read is None:
            rows = self._run(self._since_op(memory_id, None), transaction=False)
            read = self._window(memory_id, None, rows)
            assert read is not None  # every row has its text
        return read

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage] = (),
        since: object = None,
    ) -> WindowRead:
        """In one statement, remove the messages whose id is in ``removed`` (moving them to
        history with ``keep_history``), then append ``appended`` after every stored message.

        ``history_only`` left the window in the write that brought them: with
        ``keep_history`` they are recorded in history, as evicted, before ``appended``
        (in the same transaction). With ``since`` from `get_messages_since` (or from the
        last checked write), the write is made only if no other writer appended to the
        conversation or cleared it since, else nothing is written and
        `~aiservices.stores.ConcurrentChangeError` is raised. Returns the ``since`` for the
        next read and checked write.
        """
        op, texts, whole = self._apply_op(memory_id, appended, removed, history_only, since)
        try:
            version = self._run(op, transaction=whole, write=True)
        except psycopg.errors.UniqueViolation as exc:
            self._check_duplicate(exc)
            ids = [m.message_id for m in (*history_only, *appended)]
            try:
                rows = self._run(self._find_ids_op(memory_id, ids), transaction=False)
            except psycopg.Error:
                rows = []
            raise self._duplicate(memory_id, ids, rows, removed) from None
        self._cache.remember(texts[len(texts) - len(appended) :], appended)
        if time.monotonic() >= self._next_purge:
            self._purge_by_retention()
        return _written(since, version)

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
        `forget`; a conversation a writer holds at that moment is left for the next
        purge. One transaction at ``REPEATABLE READ``: a write that lands while it runs
        makes it fail with ``psycopg.errors.SerializationFailure`` rather than erase what
        was just written (the periodic purge logs that and tries again next interval). It
        reads every row's time, so run it now and then.
        """
        return int(self._run(self._purge_op(older_than), transaction=True))

    async def apurge_idle(self, older_than: timedelta) -> int:
        """`purge_idle` for async callers."""
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
        return map(memory_id_of, [_key_of(key, full) for key, full in rows])

    # -- async twins ---------------------------------------------------------------------

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """`get_messages` for async callers."""
        rows = await self._arun(self._read_op(memory_id), transaction=False)
        return self._parse(memory_id, rows) if rows else []

    async def aget_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """`get_messages_since` for async callers."""
        rows = await self._arun(self._since_op(memory_id, since), transaction=False)
        read = self._window(memory_id, since, rows)
        if read is None:
            rows = await self._arun(self._since_op(memory_id, None), transaction=False)
            read = self._window(memory_id, None, rows)
            assert read is not None  # every row has its text
        return read

    async def aapply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage] = (),
        since: object = None,
    ) -> WindowRead:
        """`apply_changes` for async callers."""
        op, texts, whole = self._apply_op(memory_id, appended, removed, history_only, since)
        try:
            version = await self._arun(op, transaction=whole, write=True)
        except psycopg.errors.UniqueViolation as exc:
            self._check_duplicate(exc)
            ids = [m.message_id for m in (*history_only, *appended)]
            try:
                rows = await self._arun(self._find_ids_op(memory_id, ids), transaction=False)
            except psycopg.Error:
                rows = []
            raise self._duplicate(memory_id, ids, rows, removed) from None
        self._cache.remember(texts[len(texts) - len(appended) :], appended)
        if time.monotonic() >= self._next_purge:
            await self._apurge_by_retention()
        return _written(since, version)

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """`update_messages` for async callers."""
        op, new, texts = self._update_op(memory_id, messages)
        await self._arun(op, transaction=True)
        self._cache.remember(texts, new)

    async def adelete_messages(self, memory_id: Hashable) -> None:
        """`delete_messages` for async callers."""
        await self._arun(self._delete_op(memory_id), transaction=True)

    async def aget_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """`get_history` for async callers."""
        rows = await self._arun(self._history_op(memory_id), transaction=False)
        return self._history(memory_id, rows)

    async def aforget(self, memory_id: Hashable) -> None:
        """`forget` for async callers."""
        await self._arun(self._forget_op(memory_id), transaction=True)

    # -- operations ----------------------------------------------------------------------

    def _read_op(self, memory_id: Hashable) -> _Op:
        key, _ = _file_key(memory_id)
        return (yield _Query(self._sql.read, (key,), fetch=True))

    def _since_op(self, memory_id: Hashable, since: object) -> _Op:
        after = since.after if isinstance(since, WindowRead) else -1
        key, _ = _file_key(memory_id)
        return (yield _Query(self._sql.read_since, (after, key, key), fetch=True))

    def _history_op(self, memory_id: Hashable) -> _Op:
        key, _ = _file_key(memory_id)
        return (yield _Query(self._sql.read_history, (key, key), fetch=True))

    def _apply_op(
        self,
        memory_id: Hashable,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage] = (),
        since: object = None,
    ) -> tuple[_Op, list[str], bool]:
        """The write, its messages' texts, and whether it needs a transaction (more than
        one statement). The write returns the conversation's last_seq after it."""
        if history_only and self.keep_history:
            # Appended ahead of the others, then moved to history: numbered in order.
            op, texts, _ = self._apply_op(
                memory_id, [*history_only, *appended], removed, since=since
            )
            ids = [m.message_id for m in history_only]
            key, _ = _file_key(memory_id)
            return _then(op, _Query(self._sql.evict, (key, ids))), texts, True
        appended_ids(appended, removed)
        texts = [message_to_json(m) for m in appended]
        key, full = _file_key(memory_id)
        s = self._sql
        read = since.version if isinstance(since, WindowRead) else None
        n = len(appended)
        if appended:
            # A plan read on a conversation's row may only update that row.
            if read is None or read == -1:
                take: tuple[Any, ...] = (key, n, full, read)
                turns = s.turns
            else:
                take = (n, key, read)
                turns = s.held_turns
            rows = _rows(appended, texts)
            if removed:
                statement = turns[2] if self.keep_history else turns[1]
                query = _Query(statement, (*take, list(removed), n, *rows), fetch=True)
            else:
                query = _Query(turns[0], (*take, n, *rows), fetch=True)
            return _appending(query, memory_id), texts, False
        if removed:
            statement = s.remove_evict if self.keep_history else s.remove
            query = _Query(statement, (key, read, list(removed)), fetch=True)
            return _removing(query, memory_id, read), texts, False
        if read is not None:
            return _nothing(read), texts, False
        return _single(_Query(s.version, (key,), fetch=True), first=True), texts, False

    def _update_op(
        self, memory_id: Hashable, messages: Sequence[ChatMessage]
    ) -> tuple[_Op, list[ChatMessage], list[str]]:
        new = with_message_ids(messages)
        check_unique_ids(new)
        texts = [message_to_json(m) for m in new]
        if not new:
            return self._delete_op(memory_id), new, texts
        key, full = _file_key(memory_id)
        s = self._sql
        history = self.keep_history
        wanted = [(m.message_id, text) for m, text in zip(new, texts, strict=True)]

        def op() -> _Op:
            yield _Query(s.allocate, (key, 0, full))  # the lock, creating the conversation's row
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
            ((last,),) = yield _Query(s.allocate_returning, (key, len(fresh), full), fetch=True)
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
        key, _ = _file_key(memory_id)
        s = self._sql
        locked = yield _Query(s.lock_changed, (key,), fetch=True)
        if not locked:
            return  # no conversation row: nothing stored
        if self.keep_history:
            yield _Query(s.evict_all, (key,))
        else:
            yield _Query(s.delete_all, (key,))
        # Sequence numbers must go on after any history; without history they may restart.
        yield _Query(s.drop_conversation_without_history, (key, key))

    def _forget_op(self, memory_id: Hashable) -> _Op:
        key, _ = _file_key(memory_id)
        s = self._sql
        yield _Query(s.lock, (key,))
        yield _Query(s.delete_all, (key,))
        yield _Query(s.forget_history, (key,))
        yield _Query(s.drop_conversation, (key,))

    # -- drivers -------------------------------------------------------------------------

    def _run(
        self, op: _Op, *, transaction: bool, write: bool = False, check_schema: bool = True
    ) -> Any:
        # transaction: the op's statements are one transaction; write: its one statement
        # writes, and is committed only once its result is in (see _drive).
        if check_schema and not self._schema_ready:
            with self._schema_lock:
                if not self._schema_ready:
                    self.create_schema()
        source = self._source
        deadline = time.monotonic() + self._timeout
        with source.connection(deadline) as conn:
            alarm = _WATCHDOG.arm(conn, deadline)
            try:
                return _drive(conn, op, transaction=transaction, write=write)
            except psycopg.Error as exc:
                if _WATCHDOG.disarm(alarm):
                    raise self._no_answer(source.where) from exc
                if isinstance(exc, psycopg.OperationalError) and conn.closed:
                    source.purge()  # the connection broke, not just the statement
                raise
            finally:
                if _WATCHDOG.disarm(alarm):
                    # Cut as the answer came, or after another error: the connection is of
                    # no more use, and a pool replaces a closed one.
                    conn.close()

    async def _arun(
        self, op: _Op, *, transaction: bool, write: bool = False, check_schema: bool = True
    ) -> Any:
        pool = self._apool()
        if pool is None:
            return await thread_call(
                self._run, op, transaction=transaction, write=write, check_schema=check_schema
            )
        if check_schema and not self._schema_ready:
            await self.acreate_schema()
        deadline = time.monotonic() + self._timeout
        async with self._aconnection(pool, deadline) as conn:
            alarm = _WATCHDOG.arm(conn, deadline)
            try:
                return await _adrive(conn, op, transaction=transaction, write=write)
            except psycopg.Error as exc:
                if _WATCHDOG.disarm(alarm):
                    raise self._no_answer(self._awhere(pool)) from exc
                if (
                    isinstance(exc, psycopg.OperationalError)
                    and conn.closed
                    and pool is self._async_pool
                ):
                    # The connection broke: drop the idle ones of a pool passed in that
                    # broke with it. (The store's own pools check each as they hand it out;
                    # a round trip to every idle one could wait on a frozen server.)
                    await pool.check()
                raise
            finally:
                if _WATCHDOG.disarm(alarm):
                    await conn.close()

    @asynccontextmanager
    async def _aconnection(
        self, pool: AsyncConnectionPool[Any], deadline: float
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if pool.closed:
            await pool.open()  # a pool made for this loop, on its first call
        connector = self._connector
        if pool is self._async_pool or connector is None:
            try:
                conn = await pool.getconn(timeout=_left(deadline))
            except PoolTimeout as exc:
                raise _busy(_pool_where(pool), self._timeout, pool.max_size, None) from exc
            pooled = True
        else:
            conn, pooled = await connector.atake(pool, deadline, self._max_connections)
        try:
            yield conn
        finally:
            if pooled:
                await pool.putconn(conn)
            else:
                await conn.close()

    def _awhere(self, pool: AsyncConnectionPool[Any]) -> str:
        if pool is not self._async_pool and self._connector is not None:
            return self._connector.where
        return _pool_where(pool)

    def _no_answer(self, where: str) -> psycopg.OperationalError:
        return psycopg.OperationalError(
            f"the PostgreSQL server at {where} did not answer within {self._timeout:g} s "
            "(the store's timeout), so the call gave up and closed its connection; check that "
            "the server is running and reachable, or pass a larger timeout= if it is only slow"
        )

    def _apool(self) -> AsyncConnectionPool[Any] | None:
        if self._async_pool is not None:
            return self._async_pool
        connector = self._connector
        if connector is None:
            return None
        if self._source.closed:
            raise _closed(connector.where)  # else a new pool would open for this loop
        # An asyncio connection belongs to the event loop that opened it: one pool per loop.
        # It opens connections only for calls that wait for them (min_size=0): one it opened
        # ahead, still connecting when its loop ends (asyncio.run returning), swallows the
        # cancellation asyncio.run ends with, and the process hangs there.
        return self._loop_pools.get(
            lambda: AsyncConnectionPool(
                connector.dsn,
                connection_class=connector.async_class,
                min_size=0,
                max_size=self._max_connections,
                kwargs=connector.kwargs,
                configure=connector.aconfigure,
                timeout=self._timeout,
                reconnect_timeout=_RECONNECT,
                open=False,
                name=f"aiservices:{self.table}:async",
            )
        )

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pools this store made (not a pool or connection passed in).

        An async pool is closed in its own event loop: at once if that loop is idle, soon if
        it is running; one whose loop has already closed can no longer be closed (call
        `aclose` in the loop before it ends).
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

    def _window(
        self, memory_id: Hashable, since: object, rows: _Rows
    ) -> tuple[list[ChatMessage], WindowRead] | None:
        """`window_since` of what `_since_op` read: the window's ``(seq, message_id,
        message)`` rows and ``(version, None, None)``, last as the query is planned."""
        rows = list(rows)
        at = len(rows) - 1
        if rows[at][1] is not None:  # (a plan that puts the union's parts in another order)
            at = next(i for i, row in enumerate(rows) if row[1] is None)
        version = rows.pop(at)[0]
        return window_since(rows, since, self._parser(memory_id, rows), version)

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

    def _find_ids_op(self, memory_id: Hashable, ids: list[str | None]) -> _Op:
        """The query for which of ``ids`` the conversation holds."""
        key, _ = _file_key(memory_id)
        return _single(_Query(self._sql.find_ids, (key, ids), fetch=True))

    def _duplicate(
        self,
        memory_id: Hashable,
        ids: list[str | None],
        rows: Sequence[tuple[str]],
        removed: Collection[str],
    ) -> ValueError:
        """The error naming the appended id the conversation already held (``rows``: what
        `_find_ids_op` found once the write was rolled back)."""
        stored = {mid for (mid,) in rows} - set(removed)
        return duplicate_id_error(next((i for i in ids if i in stored), ids[0]), memory_id)


def _single(query: _Query, *, first: bool = False) -> _Op:
    # first: the value of the one row's one column.
    rows = yield query
    return rows[0][0] if first else rows


def _then(op: _Op, query: _Query) -> _Op:
    result = yield from op
    yield query
    return result


def _nothing(result: Any = None) -> _Op:
    return result
    yield


def _appending(query: _Query, memory_id: Hashable) -> _Op:
    # No row: a checked write's conversation had changed, and nothing was written.
    rows = yield query
    if not rows:
        raise ConcurrentChangeError(memory_id)
    return rows[0][0]


def _removing(query: _Query, memory_id: Hashable, read: int | None) -> _Op:
    rows = yield query
    version = rows[0][0] if rows else -1
    if read is not None and version != read:
        raise ConcurrentChangeError(memory_id)  # and the removals were not made
    return version


def _written(since: object, version: int) -> WindowRead:
    """What a write planned on ``since`` returns, the conversation at ``version`` after it."""
    if isinstance(since, WindowRead):
        return since.at(version)
    return WindowRead(-1, [], [], version)


def _rows(messages: Sequence[ChatMessage], texts: Sequence[str]) -> tuple[list[Any], ...]:
    """The columns of ``messages`` as arrays: message_id, turn_id, created_at, message."""
    created = [
        None
        if m.created_at is None
        else (m.created_at.replace(tzinfo=UTC) if m.created_at.tzinfo is None else m.created_at)
        for m in messages
    ]
    return [m.message_id for m in messages], [m.turn_id for m in messages], created, list(texts)


def _drive(conn: psycopg.Connection[Any], op: _Op, *, transaction: bool, write: bool) -> Any:
    # On an autocommit connection a read of one statement is its own transaction; otherwise
    # one is opened and ended here, so that none is left open.
    if not (transaction or write) and conn.autocommit:
        return _steps(conn, op)
    if transaction or not conn.autocommit:
        with conn.transaction():  # psycopg commits once the statements' results are in
            return _steps(conn, op)
    # A write of one statement: in autocommit the server would commit it as it runs it,
    # even if it ran it only after the call had given up (a frozen server that goes on),
    # behind the caller's back. BEGIN goes with the statement, in one round trip, and
    # COMMIT only once its result is in: a statement cut off is rolled back. Its rows are
    # read once the Sync sent as the pipeline ends has brought them: read inside it, they
    # would be waited for before that Sync is sent, a round trip more.
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            query, result = _first(op)
            if query is not None:
                cursor = conn.cursor(row_factory=tuple_row).execute(query.sql, query.params)
        if query is not None:
            result = _steps(conn, op, cursor.fetchall() if query.fetch else None)
    except BaseException:
        if conn.info.transaction_status in _OPEN:
            with suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


_OPEN: Final = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


def _first(op: _Op) -> tuple[_Query | None, Any]:
    """The operation's first statement, or ``None`` and its result if it needs none."""
    try:
        return op.send(None), None
    except StopIteration as stop:
        return None, stop.value


def _steps(conn: psycopg.Connection[Any], op: _Op, rows: _Rows | None = None) -> Any:
    # rows: those of the statement the operation yielded last, already run.
    while True:
        try:
            query = op.send(rows)
        except StopIteration as stop:
            return stop.value
        # Rows as tuples, whatever row factory a connection handed in was made with.
        cursor = conn.cursor(row_factory=tuple_row).execute(query.sql, query.params)
        rows = cursor.fetchall() if query.fetch else None


async def _adrive(
    conn: psycopg.AsyncConnection[Any], op: _Op, *, transaction: bool, write: bool
) -> Any:
    if not (transaction or write) and conn.autocommit:
        return await _asteps(conn, op)
    if transaction or not conn.autocommit:
        async with conn.transaction():
            return await _asteps(conn, op)
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            query, result = _first(op)
            if query is not None:
                cursor = conn.cursor(row_factory=tuple_row)
                await cursor.execute(query.sql, query.params)
        if query is not None:
            result = await _asteps(conn, op, await cursor.fetchall() if query.fetch else None)
    except BaseException:
        if conn.info.transaction_status in _OPEN:
            with suppress(psycopg.Error):
                await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")
    return result


async def _asteps(conn: psycopg.AsyncConnection[Any], op: _Op, rows: _Rows | None = None) -> Any:
    while True:
        try:
            query = op.send(rows)
        except StopIteration as stop:
            return stop.value
        cursor = await conn.cursor(row_factory=tuple_row).execute(query.sql, query.params)
        rows = await cursor.fetchall() if query.fetch else None


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        return bool(poll.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


def _left(deadline: float, most: float = math.inf) -> float:
    """Seconds to wait until ``deadline``, at most ``most``; never 0, which pools refuse."""
    return max(min(deadline - time.monotonic(), most), 0.001)


def _whole_seconds(seconds: float) -> int:
    # libpq reads connect_timeout in whole seconds, below 2 as 2, and 0 as "no limit".
    return max(2, math.ceil(seconds))


def _check_dsn(dsn: str, what: str) -> None:
    """Raise ``psycopg.ProgrammingError`` if libpq can't parse ``dsn``, saying why.

    The pool would only retry it in the background, and every call wait out its timeout.
    """
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise psycopg.ProgrammingError(
            f"{what} given to PostgresChatMemoryStore is not a valid libpq connection string "
            f"or URL: {_dsn_problem(dsn, exc)}; check the option names (libpq's "
            "connection parameters), their quoting, or the URL's form"
        ) from None  # psycopg's error may quote the password


def _dsn_problem(dsn: str, error: psycopg.Error) -> str:
    """What libpq said about ``dsn``, with anything that may be part of a password masked.

    libpq quotes the token it stopped at, or the whole URL: a token that is not an option's
    name (a password with a space, say) is masked, and so is the password in a URL.
    """

    def masked(match: re.Match[str]) -> str:
        fragment = match.group(1)
        if len(fragment) <= 1 or re.search(rf"(?:^|[\s?&]){re.escape(fragment)}\s*=", dsn):
            return match.group(0)  # punctuation, or an option's name
        if fragment == dsn.strip():
            url = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", fragment)
            return '"' + re.sub(r"(password=)[^&]*", r"\1***", url) + '"'
        return '"***"'

    return re.sub(r'"([^"]*)"', masked, _one_line(error))


class _Connector:
    """How a store connects from its DSN, and what its last attempt to connect found."""

    def __init__(
        self,
        dsn: str,
        *,
        timeout: float,
        connect_timeout: float,
        settings: dict[str, float | None],
    ) -> None:
        self.dsn = dsn
        self.where = _redact(dsn)
        self.timeout = timeout
        self.connect_timeout = float(connect_timeout)
        self.kwargs: dict[str, Any] = {
            **_tcp_defaults(dsn),
            "autocommit": True,
            "connect_timeout": _whole_seconds(connect_timeout),
        }
        chosen = {name: value for name, value in settings.items() if value is not None}
        self._settings = (
            "SELECT " + ", ".join(f"set_config('{name}', %s, false)" for name in chosen)
            if chosen
            else None
        )
        self._values = [str(max(1, round(value * 1000))) for value in chosen.values()]
        # The error of the last attempt to connect, by the pools or by a call; None once
        # one succeeds.
        self.failure: psycopg.Error | None = None
        self.connection_class = _tracked(self)
        self.async_class = _atracked(self)

    # -- a connection for a call -------------------------------------------------------

    def take(
        self, pool: ConnectionPool[Any], deadline: float, max_connections: int
    ) -> tuple[psycopg.Connection[Any], bool]:
        """A connection for a call, and whether it is the pool's (else the call closes it)."""
        if self.failure is None:
            try:
                return self._checked(pool, min(deadline, time.monotonic() + _GRACE)), True
            except PoolTimeout:
                pass
            if self.failure is None:  # the pool is busy, or still connecting: wait on
                try:
                    return self._checked(pool, deadline), True
                except PoolTimeout as exc:
                    raise _busy(self.where, self.timeout, max_connections, self.failure) from exc
        # The server refused or ignored the last attempt to connect. A connection the pool
        # holds may still serve (a server that is full refuses new ones only): an idle one
        # goes first. Else the call tries to connect now rather than after the pool's pause,
        # to use the connection or say why there is none.
        try:
            return self._checked(pool, time.monotonic()), True
        except PoolTimeout:
            return self.connect(deadline), False

    async def atake(
        self, pool: AsyncConnectionPool[Any], deadline: float, max_connections: int
    ) -> tuple[psycopg.AsyncConnection[Any], bool]:
        """`take` for an async pool."""
        if self.failure is None:
            try:
                return await self._achecked(pool, min(deadline, time.monotonic() + _GRACE)), True
            except PoolTimeout:
                pass
            if self.failure is None:
                try:
                    return await self._achecked(pool, deadline), True
                except PoolTimeout as exc:
                    raise _busy(self.where, self.timeout, max_connections, self.failure) from exc
        try:
            return await self._achecked(pool, time.monotonic()), True
        except PoolTimeout:
            return await self.aconnect(deadline), False

    def connect(self, deadline: float) -> psycopg.Connection[Any]:
        """A connection of the call's own, or the error that says why the server gave none."""
        start = time.monotonic()
        try:
            conn = self.connection_class.connect(self.dsn, **self._kwargs_until(deadline))
        except psycopg.Error as exc:
            raise _unreachable(self.where, exc, time.monotonic() - start) from exc
        self.configure(conn)
        return conn

    async def aconnect(self, deadline: float) -> psycopg.AsyncConnection[Any]:
        """`connect` for async callers."""
        start = time.monotonic()
        try:
            conn = await self.async_class.connect(self.dsn, **self._kwargs_until(deadline))
        except psycopg.Error as exc:
            raise _unreachable(self.where, exc, time.monotonic() - start) from exc
        await self.aconfigure(conn)
        return conn

    def _kwargs_until(self, deadline: float) -> dict[str, Any]:
        seconds = min(self.connect_timeout, max(deadline - time.monotonic(), 0.0))
        return {**self.kwargs, "connect_timeout": _whole_seconds(seconds)}

    # -- pool callbacks --------------------------------------------------------------------

    def configure(self, conn: psycopg.Connection[Any]) -> None:
        """Set the server-side timeouts on a new connection."""
        if self._settings is None:
            return
        try:
            with _bounded(conn, self.connect_timeout, "setting the timeouts"):
                conn.execute(self._settings, self._values)
        except BaseException:
            conn.close()  # a pool drops a connection its configure fails on, unclosed
            raise

    async def aconfigure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """`configure` for async pools."""
        if self._settings is None:
            return
        try:
            with _bounded(conn, self.connect_timeout, "setting the timeouts"):
                await conn.execute(self._settings, self._values)
        except BaseException:
            await conn.close()
            raise

    # An idle connection has nothing to read, unless its server closed it (or is closing it,
    # saying why), as when the server restarted while the connection sat in the pool. Only
    # then is the connection tested with a round trip, and replaced if it fails. The check
    # is the store's, not the pool's: a pool pauses after each failed check (1 s, 2 s,
    # 4 s...), so a few connections a restart closed would hold the call up to its timeout.
    def _checked(self, pool: ConnectionPool[Any], deadline: float) -> psycopg.Connection[Any]:
        """A pooled connection, the idle ones the server closed dropped on the way."""
        while True:
            conn: psycopg.Connection[Any] = pool.getconn(timeout=_left(deadline))
            if not _readable(conn.fileno()):
                return conn
            try:
                with _bounded(conn, self.connect_timeout, "a connection check"):
                    ConnectionPool.check_connection(conn)
            except Exception:
                conn.close()
                pool.putconn(conn)  # closed: the pool drops it and opens another
                continue
            return conn

    async def _achecked(
        self, pool: AsyncConnectionPool[Any], deadline: float
    ) -> psycopg.AsyncConnection[Any]:
        """`_checked` for async pools."""
        while True:
            conn: psycopg.AsyncConnection[Any] = await pool.getconn(timeout=_left(deadline))
            if not _readable(conn.fileno()):
                return conn
            try:
                with _bounded(conn, self.connect_timeout, "a connection check"):
                    await AsyncConnectionPool.check_connection(conn)
            except Exception:
                await conn.close()
                await pool.putconn(conn)
                continue
            return conn


def _tracked(connector: _Connector) -> type[psycopg.Connection[Any]]:
    """A connection class whose every attempt to connect ``connector`` hears of."""

    class Connection(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            try:
                conn = super().connect(conninfo, **kwargs)
            except psycopg.Error as exc:  # any: one that is not operational won't pass either
                connector.failure = exc
                raise
            connector.failure = None
            return conn

    return Connection


def _atracked(connector: _Connector) -> type[psycopg.AsyncConnection[Any]]:
    """`_tracked` for async connections."""

    class AsyncConnection(psycopg.AsyncConnection[Any]):
        @classmethod
        async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            try:
                conn = await super().connect(conninfo, **kwargs)
            except psycopg.Error as exc:
                connector.failure = exc
                raise
            connector.failure = None
            return conn

    return AsyncConnection


class _Source:
    """Where the sync methods get a connection."""

    where: str  # the server, as errors name it

    @contextmanager
    def connection(self, deadline: float) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one call, by ``deadline`` (a ``time.monotonic()``)."""
        raise NotImplementedError
        yield

    def purge(self) -> None:
        """A connection broke: drop the idle ones that broke with it."""

    def close(self) -> None:
        """Close what the store made."""

    @property
    def closed(self) -> bool:
        """Whether the store closed what it made (never, for what it was given)."""
        return False


class _GivenPool(_Source):
    def __init__(self, pool: ConnectionPool[Any], timeout: float) -> None:
        self.pool = pool
        self.timeout = timeout
        self.where = _pool_where(pool)

    @contextmanager
    def connection(self, deadline: float) -> Iterator[psycopg.Connection[Any]]:
        try:
            conn = self.pool.getconn(timeout=_left(deadline))
        except PoolTimeout as exc:
            raise _busy(self.where, self.timeout, self.pool.max_size, None) from exc
        try:
            yield conn
        finally:
            self.pool.putconn(conn)

    def purge(self) -> None:
        self.pool.check()


class _OwnPool(_Source):
    def __init__(self, connector: _Connector, max_connections: int, timeout: float) -> None:
        self.connector = connector
        self.where = connector.where
        self.max_connections = max_connections
        self.pool: ConnectionPool[Any] = ConnectionPool(
            connector.dsn,
            connection_class=connector.connection_class,
            min_size=1,
            max_size=max_connections,
            kwargs=connector.kwargs,
            configure=connector.configure,
            timeout=timeout,
            # Retrying a lost server in the background backs off (1 s, 2 s, 4 s...): stop
            # soon, so that the first call after the server is back starts a new attempt.
            reconnect_timeout=_RECONNECT,
            open=False,
            name="aiservices",
        )
        self._opened = False
        self._lock = threading.Lock()

    @contextmanager
    def connection(self, deadline: float) -> Iterator[psycopg.Connection[Any]]:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self.pool.open()  # connects in the background; calls wait for it
                    self._opened = True
        if self.pool.closed:
            raise _closed(self.where)
        conn, pooled = self.connector.take(self.pool, deadline, self.max_connections)
        try:
            yield conn
        finally:
            if pooled:
                self.pool.putconn(conn)
            else:
                conn.close()

    def purge(self) -> None:
        # The pool checks a connection as it hands it out; a round trip to each idle one
        # here could wait on a frozen server.
        pass

    def close(self) -> None:
        with self._lock:
            self._opened = True  # a closed pool can't open again: calls now fail
            self.pool.close()

    @property
    def closed(self) -> bool:
        return self._opened and self.pool.closed


class _GivenConnection(_Source):
    def __init__(self, conn: psycopg.Connection[Any], timeout: float) -> None:
        self.conn = conn
        self.timeout = timeout
        self.where = _redact(conn.info.dsn)
        self.lock = threading.Lock()

    @contextmanager
    def connection(self, deadline: float) -> Iterator[psycopg.Connection[Any]]:
        if not self.lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise psycopg.OperationalError(
                f"the connection to the PostgreSQL server at {self.where} that the store was "
                f"given stayed busy with other calls for {self.timeout:g} s; give the store a "
                "pool, or a larger timeout="
            )
        try:
            yield self.conn
        finally:
            self.lock.release()


# -- the watchdog ---------------------------------------------------------------------------

_AnyConnection: TypeAlias = "psycopg.Connection[Any] | psycopg.AsyncConnection[Any]"


class _Alarm:
    """A call in flight on ``conn``, and whether its deadline cut the connection."""

    __slots__ = ("at", "conn", "fired")

    def __init__(self, at: float, conn: _AnyConnection) -> None:
        self.at = at
        self.conn = conn
        self.fired = False


class _Watchdog:
    """Cuts the connection of every call still waiting for the server past its deadline.

    One daemon thread serves every store of the process. While calls are in flight (and for
    ``linger`` seconds after, so that a steady stream of calls doesn't wake it each time) it
    looks at them every ``tick`` seconds; a call past its deadline has its socket shut down,
    which wakes the call with an error however the server behaves: a frozen server's kernel
    still acknowledges what it is sent, so neither TCP keepalives nor a user timeout would.
    """

    def __init__(self, tick: float = 0.05, linger: float = 10.0) -> None:
        self.tick = tick
        self.linger = linger
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)  # the thread did not come along

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._alarms: set[_Alarm] = set()
        self._thread: threading.Thread | None = None
        self._sleeping = False

    def arm(self, conn: _AnyConnection, deadline: float) -> _Alarm:
        """Cut ``conn`` at ``deadline`` (a ``time.monotonic()``) unless disarmed before."""
        alarm = _Alarm(deadline, conn)
        with self._cond:
            self._alarms.add(alarm)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch,
                    args=(self._cond,),
                    name="aiservices-postgres-watchdog",
                    daemon=True,
                )
                self._thread.start()
            elif self._sleeping:
                self._sleeping = False
                self._cond.notify()
        return alarm

    def disarm(self, alarm: _Alarm) -> bool:
        """Forget ``alarm``; whether it had cut its connection. Calling it again is harmless."""
        with self._cond:
            self._alarms.discard(alarm)
        return alarm.fired

    def _watch(self, cond: threading.Condition) -> None:
        idle_since = time.monotonic()
        with cond:
            while cond is self._cond:  # else the process forked: this thread is gone there
                now = time.monotonic()
                if self._alarms:
                    idle_since = now
                    for alarm in [a for a in self._alarms if a.at <= now]:
                        self._alarms.discard(alarm)
                        alarm.fired = True
                        _cut(alarm.conn)
                elif now - idle_since >= self.linger:
                    self._sleeping = True
                    cond.wait()
                    idle_since = time.monotonic()
                    continue
                cond.wait(self.tick)


def _cut(conn: _AnyConnection) -> None:
    # The socket is shut down, not closed: the call blocked on it wakes (it reads
    # end-of-file, and its connection breaks), and the descriptor stays its connection's.
    try:
        if conn.closed:
            return
        sock = socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, psycopg.Error):
        return
    with sock, suppress(OSError):  # closing the duplicate only
        sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG: Final = _Watchdog()


@contextmanager
def _bounded(conn: _AnyConnection, seconds: float, what: str) -> Iterator[None]:
    """Run the block with ``conn`` cut after ``seconds``, raising if it was."""
    alarm = _WATCHDOG.arm(conn, time.monotonic() + seconds)
    try:
        yield
    finally:
        if _WATCHDOG.disarm(alarm):
            raise psycopg.OperationalError(
                f"the server did not answer {what} within {seconds:g} s; connection closed"
            )


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
                "last_seq bigint NOT NULL, full_key bytea)",
                f"CREATE TABLE {{table}} ({columns}, PRIMARY KEY (memory_key, seq), "
                "CONSTRAINT {message_id} UNIQUE (memory_key, message_id))",
                f"CREATE TABLE {{history}} ({columns}, evicted_at timestamptz NOT NULL, "
                "PRIMARY KEY (memory_key, seq))",
            )
        )
        self.read = render("SELECT seq, message FROM {table} WHERE memory_key = %s ORDER BY seq")
        # Rows at or below the first parameter were read before: their text is not sent.
        # One more row, (last_seq, NULL, NULL), brings the conversation's version (-1: no
        # row) in the same snapshot as the window: a column on every row would be decoded
        # once per row, and a union sorted as a whole would sort the window rather than
        # read it in index order.
        self.read_since = render(
            "(SELECT seq, message_id, CASE WHEN seq > %s THEN message END FROM {table} "
            "WHERE memory_key = %s ORDER BY seq) "
            "UNION ALL SELECT coalesce((SELECT last_seq FROM {conversations} "
            "WHERE memory_key = %s), -1), NULL, NULL"
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
            "unnest(%b::text[], %b::text[], %b::timestamptz[], %b::text[]) "
            "WITH ORDINALITY AS u(message_id, turn_id, created_at, message, ord)"
        )
        # Taking sequence numbers locks the conversation's row until the transaction ends.
        # A conversation begun (again) numbers from the clock in microseconds: numbers held
        # by a reader of one emptied before are lower, since writing them took longer. The
        # transaction's now() is the same at both places it is read.
        clock = "(extract(epoch FROM now()) * 1000000)::bigint"
        allocate = (
            "INSERT INTO {conversations} AS c (memory_key, last_seq, full_key) "
            f"VALUES (%s, {clock} + %s, %s) "
            "ON CONFLICT (memory_key) DO UPDATE SET "
            f"last_seq = c.last_seq + excluded.last_seq - {clock}"
        )
        self.allocate = render(allocate)
        self.allocate_returning = render(f"{allocate} RETURNING last_seq")
        self.lock = render("SELECT last_seq FROM {conversations} WHERE memory_key = %s FOR UPDATE")
        # Emptying a window changes last_seq, so that a checked write planned before fails.
        self.lock_changed = render(
            "UPDATE {conversations} SET last_seq = last_seq + 1 WHERE memory_key = %s "
            "RETURNING last_seq"
        )
        self.version = render(
            "SELECT coalesce((SELECT last_seq FROM {conversations} WHERE memory_key = %s), -1)"
        )
        # A turn: take numbers, then insert after them. With removals, the deletions run
        # first (the count in the WHERE makes the insert wait for them), so a message may be
        # removed and appended again in one call. Every writer locks the conversation's row
        # before any of its message rows (the deletions read the key from the row they
        # locked), else a turn and a forget could each hold what the other waits for.
        # A checked write takes numbers only if last_seq is still the one its plan read
        # (the take's last parameter; NULL: unchecked, -1: no row). Under READ COMMITTED a
        # subquery on the messages would see the statement's snapshot, taken before the
        # lock wait; these conditions are on the locked row itself, which PostgreSQL
        # evaluates again on its newest version once the lock is held (a snapshot showing
        # another last_seq already shows a change). With the condition unmet nothing is
        # taken, so nothing is deleted or inserted, and the statement returns no row.
        take = (
            f"c AS ({allocate} WHERE c.last_seq = coalesce(%s::bigint, c.last_seq) "
            "RETURNING memory_key, last_seq)"
        )
        # A conversation read with a row: an UPDATE, which never creates one.
        take_held = (
            "c AS (UPDATE {conversations} AS c SET last_seq = c.last_seq + %s "
            "WHERE c.memory_key = %s AND c.last_seq = %s::bigint RETURNING memory_key, last_seq)"
        )
        # Removals only: the row's newest last_seq is returned (none: no row), and the rows
        # are deleted only if it is the one read.
        held = (
            "held AS (SELECT memory_key, last_seq FROM {conversations} WHERE memory_key = %s "
            "FOR UPDATE), checked AS (SELECT memory_key FROM held "
            "WHERE last_seq = coalesce(%s::bigint, last_seq))"
        )
        append = (
            "added AS (INSERT INTO {table} "
            "(memory_key, seq, message_id, turn_id, created_at, message) "
            "SELECT c.memory_key, c.last_seq - %s + u.ord, u.message_id, u.turn_id, "
            f"u.created_at, u.message FROM c, {new_rows}"
        )
        after_gone = " WHERE (SELECT count(*) FROM gone) >= 0"
        delete_ids = "DELETE FROM {table} WHERE memory_key = %s AND message_id = ANY(%b)"

        def delete_locked(locked: str) -> str:
            return delete_ids.replace("= %s", f"= (SELECT memory_key FROM {locked})", 1)

        to_history = (
            f"INSERT INTO {{history}} ({all_columns}, evicted_at) "
            f"SELECT {all_columns}, clock_timestamp() FROM gone"
        )

        def turns(take: str) -> tuple[str, str, str]:
            # Appending, deleting and appending, evicting and appending.
            return (
                render(f"WITH {take}, {append}) SELECT last_seq FROM c"),
                render(
                    f"WITH {take}, gone AS ({delete_locked('c')} RETURNING 1), "
                    f"{append}{after_gone}) SELECT last_seq FROM c"
                ),
                render(
                    f"WITH {take}, gone AS ({delete_locked('c')} RETURNING {all_columns}), "
                    f"moved AS ({to_history}), {append}{after_gone}) SELECT last_seq FROM c"
                ),
            )

        self.turns = turns(take)
        self.held_turns = turns(take_held)
        self.remove = render(
            f"WITH {held}, gone AS ({delete_locked('checked')}) SELECT last_seq FROM held"
        )
        self.remove_evict = render(
            f"WITH {held}, gone AS ({delete_locked('checked')} RETURNING {all_columns}), "
            f"moved AS ({to_history}) SELECT last_seq FROM held"
        )
        # Under a lock already held: an update has locked the conversation's row.
        self.delete_ids = render(delete_ids)
        self.evict = render(f"WITH gone AS ({delete_ids} RETURNING {all_columns}) {to_history}")
        self.copy_to_history = render(
            f"INSERT INTO {{history}} ({all_columns}, evicted_at) "
            f"SELECT {all_columns}, clock_timestamp() FROM {{table}} "
            "WHERE memory_key = %s AND message_id = ANY(%s)"
        )
        numbered_rows = (
            "unnest(%b::text[], %b::text[], %b::timestamptz[], %b::text[], %b::bigint[]) "
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
        # A conversation that holds rows: one whose last messages were removed keeps its
        # numbering row until it is purged or written again, but holds nothing.
        self.keys = render(
            "SELECT c.memory_key, c.full_key FROM {conversations} c "
            "WHERE EXISTS (SELECT 1 FROM {table} t WHERE t.memory_key = c.memory_key) "
            "OR EXISTS (SELECT 1 FROM {history} h WHERE h.memory_key = c.memory_key)"
        )
        # Upgrading version 1: the column, and the conversations to refile under a digest.
        self.add_full_key = render(
            "ALTER TABLE {conversations} ADD COLUMN IF NOT EXISTS full_key bytea"
        )
        self.long_keys = render(
            "SELECT memory_key FROM {conversations} WHERE length(memory_key) > %s"
        )
        self.rekey_conversations = render(
            "UPDATE {conversations} AS c SET memory_key = u.new_key, full_key = u.whole "
            "FROM unnest(%s::text[], %s::text[], %s::bytea[]) AS u(old_key, new_key, whole) "
            "WHERE c.memory_key = u.old_key"
        )
        rekey = (
            "UPDATE {} AS t SET memory_key = u.new_key FROM unnest(%s::text[], %s::text[]) "
            "AS u(old_key, new_key) WHERE t.memory_key = u.old_key"
        )
        self.rekey_window = render(rekey.replace("{}", "{table}"))
        self.rekey_history = render(rekey.replace("{}", "{history}"))
        self.update_version = render("UPDATE {schema} SET value = %s WHERE name = 'version'")
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
    # A password in the DSN never reaches a repr or an error.
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<dsn>"
    return " ".join(f"{k}={'***' if 'password' in k else v}" for k, v in params.items())


def _pool_where(pool: ConnectionPool[Any] | AsyncConnectionPool[Any]) -> str:
    conninfo = pool.conninfo
    return _redact(conninfo) if isinstance(conninfo, str) else f"<the pool {pool.name!r}>"


def _tcp_defaults(dsn: str) -> dict[str, str]:
    """The TCP settings of ``_TCP_DEFAULTS`` that the DSN leaves unset."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return {}  # connecting fails, saying what is wrong with the DSN
    defaults = {k: v for k, v in _TCP_DEFAULTS.items() if k not in given}
    if psycopg.pq.version() < 120000:
        defaults.pop("tcp_user_timeout", None)  # libpq 12 added it
    return defaults


def _closed(where: str) -> PoolClosed:
    return PoolClosed(
        f"the store for the PostgreSQL server at {where} was closed: make a new "
        "PostgresChatMemoryStore, or close it only when its calls are done"
    )


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


# What a server that refuses a connection says (in English, its default), and what to do.
_REFUSALS: Final = (
    (
        ("too many clients", "too many connections", "remaining connection slots"),
        "it has no room for another connection until some close: lower the "
        "max_connections= of the stores sharing it, or raise the server's",
    ),
    (
        ("starting up", "shutting down", "in recovery mode", "not yet accepting"),
        "it is starting or stopping: try again shortly",
    ),
    (
        ("authentication failed", "password", "does not exist", "no pg_hba.conf entry"),
        "check the DSN's user, password and database",
    ),
)


def _unreachable(where: str, error: psycopg.Error, waited: float) -> psycopg.Error:
    # The cause's own class: a ConnectionTimeout stays one.
    if not isinstance(error, psycopg.OperationalError):
        # Not the server's answer but what the client was asked to do: no retry passes it.
        return type(error)(
            f"connecting to the PostgreSQL server at {where} failed ({_one_line(error)}); "
            "check the store's connection settings"
        )
    said = _one_line(error)
    if "FATAL:" in said:
        # The server answered, and refused: its reason decides the advice.
        advice = next(
            (fix for words, fix in _REFUSALS if any(w in said for w in words)),
            "see the server's reason",
        )
        return type(error)(
            f"the PostgreSQL server at {where} refused the connection ({said}); {advice}"
        )
    return type(error)(
        f"the PostgreSQL server at {where} is unreachable: an attempt to connect failed after "
        f"{waited:.1f} s ({said}); check that the server is running and that the "
        "DSN's host and port are right"
    )


def _busy(
    where: str, timeout: float, connections: int, failure: BaseException | None
) -> PoolTimeout:
    message = (
        f"no connection to the PostgreSQL server at {where} within {timeout:g} s (the "
        f"store's timeout): the {connections} connection(s) of the pool stayed in use, or the "
        "server accepted no new one in that time; pass a larger max_connections= or timeout="
    )
    if failure is not None:
        message += f" (the last attempt to connect failed: {_one_line(failure)})"
    return PoolTimeout(message)


def _corrupt(memory_id: Hashable, seq: object, reason: str, table: str) -> CorruptMessageError:
    return CorruptMessageError(
        memory_id,
        seq,
        reason,
        hint=(
            f"repair or delete the row with memory_key = {_file_key(memory_id)[0]!r} and "
            f"seq = {seq} in table {table!r} (or {table}_history)"
        ),
    )
