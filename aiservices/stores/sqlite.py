"""A persistent store in a SQLite file: one row per message, safe across threads and processes.

Schema (``table`` defaults to ``chat_messages``)::

    {table}          the window: one row per message a memory holds
        memory_key   TEXT     store_key(memory_id) (a BLOB of its UTF-8 if it holds a lone
                              surrogate, which SQLite text can't)
        seq          INTEGER  position in the conversation; PRIMARY KEY (memory_key, seq)
        message_id   TEXT     unique per conversation (index {table}_message_id)
        turn_id      TEXT     the message's turn_id, for queries
        created_at   TEXT     the message's created_at (ISO 8601), for queries
        stored_at    REAL     when the row was written (unix seconds)
        message      TEXT     the message as messages.message_to_json writes it
    {table}_history  the same columns plus evicted_at (TEXT, ISO 8601 UTC): rows that left
                     the window of a store opened with keep_history=True
    {table}_schema   name/value pairs; 'version' is the schema version

Both message tables are ``WITHOUT ROWID``, so a conversation's window is one contiguous
range of the primary key, never mixed with its history. Sequence numbers are unique across
both, and never given twice while a conversation has rows: a write numbers after the highest
row, and one that removes the newest rows and adds none moves the highest row left up to
their number.

Retention: `SqliteChatMemoryStore.purge_idle` deletes the conversations (window and
history) that no write has touched for a while; ``retention=`` runs it now and then from
writes. A conversation's last activity is its newest row's ``stored_at`` or its newest
history row's ``evicted_at``, whichever is later.

Every write is one ``BEGIN IMMEDIATE`` transaction: it takes SQLite's write lock before
reading anything, so writers in other threads and processes queue (for up to ``timeout``
seconds) instead of racing, and none loses another's messages. Within one process, writers
on the same file also queue on a lock of their own rather than in SQLite's sleep-and-retry
busy handler. Each thread reads through its own connection; in WAL mode
readers never wait for the writer.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final, Literal, Self

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
    window_since,
    with_message_ids,
)
from ._io_thread import IoThread

__all__ = ["SqliteChatMemoryStore"]

SCHEMA_VERSION: Final = 1
"""The schema this version writes; a file with a newer one is refused."""

_log = logging.getLogger("aiservices.stores")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_COLUMNS = "memory_key, seq, message_id, turn_id, created_at, stored_at, message"
_SQLITE_BUSY: Final = 5
# Seconds a write may run on the store's thread before async reads stop queuing behind it
# (a write takes well under a millisecond unless it waits on a lock).
_STALLED: Final = 0.05


class _Shared:
    # What every store object on one file in this process shares: the lock its writers
    # queue on.
    __slots__ = ("write_lock",)

    def __init__(self) -> None:
        self.write_lock = threading.Lock()


class _Holder:
    # One thread's connection. The thread-local owns the holder; the store sees it through
    # a WeakSet, so a finished thread's connection is closed without the store's help.
    __slots__ = ("__weakref__", "conn", "finalizer", "generation")

    def __init__(self, conn: sqlite3.Connection, generation: int) -> None:
        self.conn = conn
        self.generation = generation
        self.finalizer = weakref.finalize(self, _close, conn, generation)


def _close(conn: sqlite3.Connection, generation: int) -> None:
    if generation == _process.generation:
        conn.close()
    else:
        # Opened before a fork(): SQLite forbids using or closing it in the child, and
        # dropping it would close it, so it is kept for the life of the process.
        _abandoned.append(conn)


class _Process:
    # Per-process state, renewed in a forked child: the child must not touch its parent's
    # connections or locks.
    __slots__ = ("generation", "lock", "shared_by_path")

    def __init__(self) -> None:
        self.generation = 0
        self.lock = threading.Lock()
        self.shared_by_path: dict[str, _Shared] = {}

    def after_fork_in_child(self) -> None:
        self.generation += 1
        self.lock = threading.Lock()
        for shared in self.shared_by_path.values():
            shared.write_lock = threading.Lock()

    def shared_for(self, path: str) -> _Shared:
        with self.lock:
            shared = self.shared_by_path.get(path)
            if shared is None:
                shared = self.shared_by_path[path] = _Shared()
            return shared


_process = _Process()
os.register_at_fork(after_in_child=_process.after_fork_in_child)
_abandoned: list[sqlite3.Connection] = []


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class SqliteChatMemoryStore:
    """Keeps conversations in a SQLite file, writing only what changed.

    ``path`` is the database file, created with its tables if absent. With
    ``keep_history=True``, messages leaving the window move to a history table instead of
    being deleted (``delete_messages`` then empties the window and keeps the history);
    `get_history` reads the whole transcript and `forget` erases it. ``timeout``
    is how many seconds a writer waits for another process's write; ``synchronous`` is
    SQLite's durability setting (``"NORMAL"`` survives a crash of the application, ``"FULL"``
    also a power cut). Several stores, with different ``table`` names, may share one file.

    ``retention`` (a ``timedelta``) deletes conversations idle for longer, history and all:
    `purge_idle` runs when the store opens, then from the first write after
    ``min(retention / 10, 1 hour)`` has passed since the last purge, in the writing thread
    once its transaction has committed (a purge that fails is logged, and the write still
    succeeds). Without it nothing is deleted by age; call `purge_idle` from a
    scheduled job instead when no write may wait for a purge.

    Within a conversation every message has its own ``message_id``: ``update_messages``
    gives one to a message that has none, and a duplicate id is a ``ValueError``.
    """

    is_blocking: ClassVar[bool] = True
    """Its methods do file I/O: async calls run them in a worker thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_history: bool = False,
        table: str = "chat_messages",
        timeout: float = 30.0,
        synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL",
        retention: timedelta | None = None,
    ) -> None:
        raw = os.fspath(path)
        if not isinstance(raw, str):
            raise TypeError(f"path must be a str or os.PathLike[str], not {type(raw).__name__}")
        if raw in ("", ":memory:") or raw.startswith("file:"):
            raise ValueError(
                f"SqliteChatMemoryStore needs a file path, got {raw!r}; for a store that "
                "lives in memory use InMemoryChatMemoryStore, or pass a file in a "
                "temporary directory"
            )
        if not _IDENTIFIER.fullmatch(table):
            raise ValueError(
                f"table must be a plain SQL identifier (letters, digits, underscores, not "
                f"starting with a digit), got {table!r}"
            )
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        seconds = check_seconds("timeout", timeout, zero=True)
        assert seconds is not None
        self.retention = check_retention(retention)
        self.path = raw
        # Every thread opens the file by this path: a relative one would follow the working
        # directory, and a thread started after a chdir would make a second database.
        self._file = os.path.abspath(raw)
        self.keep_history = keep_history
        self.table = table
        self._timeout = seconds
        self._synchronous = synchronous
        self._shared = _process.shared_for(os.path.realpath(self._file))
        self._local = threading.local()
        self._holders: weakref.WeakSet[_Holder] = weakref.WeakSet()
        self._holders_lock = threading.Lock()
        self._closed = False
        self._sql = _Statements(table)
        self._cache = MessageCache()
        self._io_thread = IoThread(f"aiservices-sqlite:{os.path.basename(raw)}")
        self._read_thread = IoThread(f"aiservices-sqlite-read:{os.path.basename(raw)}")
        # While the store's thread runs a write: when reads stop queuing behind it.
        self._stalled_after = 0.0
        self._next_purge = float("inf")  # time.monotonic() of the next purge by retention
        # Opens the file and checks or creates the schema now; the limit is read once, so
        # that checking an id never opens a connection (on an event loop's thread, say).
        # The file opened: one deleted or replaced later must not take writes unseen (open
        # connections would go on writing to the deleted file, new ones make another).
        self._identity: tuple[int, int] | None = None
        self._max_length = self._connection().getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        self._identity = _identity(self._file)
        if self.retention is not None:
            self._purge_by_retention()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.path!r}, keep_history={self.keep_history!r}, "
            f"table={self.table!r}"
            + ("" if self.retention is None else f", retention={self.retention!r}")
            + ")"
        )

    # -- connections -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        holder: _Holder | None = getattr(self._local, "holder", None)
        if holder is not None and holder.generation == _process.generation:
            return holder.conn
        return self._connect()

    def _read_connection(self) -> sqlite3.Connection:
        """The connection for a read, once the file is checked to be the one opened: a
        read of a deleted file would show the model a conversation nothing more can be
        written to, and the turn would fail only after the model was paid for."""
        self._check_file()
        return self._connection()

    def _connect(self) -> sqlite3.Connection:
        if self._closed:
            raise sqlite3.ProgrammingError(f"Cannot operate on a closed {self!r}")
        path = self._file
        self._check_file()
        # Whether it is there first: a file another process creates between the two checks
        # would otherwise look unreadable.
        if os.path.isfile(path) and not os.access(path, os.R_OK | os.W_OK):
            # SQLite would open it read-only, and fail only at the first write.
            raise _open_error(path, None)
        try:
            conn = sqlite3.connect(
                path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.OperationalError as exc:
            raise _open_error(path, exc) from exc
        try:
            # The first statements read the file and create the WAL beside it: where a file
            # that can't be opened, or a directory that can't be written, shows.
            self._use_wal(conn)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            self._check_schema(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _OPEN_ERRORS:
                raise
            raise _open_error(path, exc) from exc
        except BaseException:
            conn.close()
            raise
        holder = _Holder(conn, _process.generation)
        self._local.holder = holder
        with self._holders_lock:
            self._holders.add(holder)
        return conn

    @contextmanager
    def _writing(self, conn: sqlite3.Connection) -> Iterator[None]:
        """A write transaction on ``conn``, begun within the store's ``timeout``.

        The writers of this process queue on one lock, then SQLite waits on other
        processes' writes: both waits come out of one ``timeout``, however many writers
        are queued ahead.
        """
        timeout = self._timeout
        lock = self._shared.write_lock
        deadline = getattr(self._local, "deadline", None) or time.monotonic() + timeout
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise _locked(self.path, timeout, "other writers of this process")
        try:
            self._check_file()
            # In steps of 50 ms, so that a connection's setting changes only after a wait.
            left = max(0, round((deadline - time.monotonic()) * 20)) * 50
            local = self._local
            if getattr(local, "busy_ms", None) != left:
                conn.execute(f"PRAGMA busy_timeout = {left}")
                local.busy_ms = left
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                yield
        finally:
            lock.release()

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode, waiting up to the timeout for connections of other
        processes opening a new file at once: SQLite answers "database is locked" to all
        but one of them at once, without its busy handler."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)

    def _check_file(self) -> None:
        """Raise if the database file is no longer the one the store opened."""
        if self._identity is not None and _identity(self._file) != self._identity:
            raise sqlite3.OperationalError(
                f"the database file {self._file!r} was deleted or replaced after the store "
                "opened it, so nothing more is written to it; make a new "
                "SqliteChatMemoryStore to use the file there now"
            )

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        sql = self._sql
        version = _schema_version(conn, sql.schema)
        if version is None:
            with self._writing(conn):
                version = _schema_version(conn, sql.schema)
                if version is None:
                    if _table_exists(conn, self.table):
                        raise StoreSchemaError(
                            f"{self.path}: table {self.table!r} exists but was not made by "
                            "aiservices; pass another table= name"
                        )
                    for statement in sql.create:
                        conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {sql.schema} (name, value) VALUES ('version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
                    version = SCHEMA_VERSION
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{self.path}: table {self.table!r} has schema version {version}, newer than "
                f"the {SCHEMA_VERSION} this version of aiservices reads; upgrade aiservices"
            )
        if version < SCHEMA_VERSION:
            raise StoreSchemaError(
                f"{self.path}: table {self.table!r} has unknown schema version {version}"
            )

    def close(self) -> None:
        """Close every connection this store opened; using it afterwards is an error."""
        self._io_thread.close()  # the async calls already queued run first
        self._read_thread.close()
        self._closed = True
        with self._holders_lock:
            holders = list(self._holders)
        for holder in holders:
            holder.finalizer()
        self._local = threading.local()

    async def aclose(self) -> None:
        """`close` for async callers: waits for queued async calls without blocking
        the event loop."""
        import asyncio

        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the store protocol --------------------------------------------------------------

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The messages in the window, oldest first; ``[]`` for an unknown id."""
        key = _key(memory_id)
        rows = self._read_connection().execute(self._sql.read, (key,)).fetchall()
        return self._parse(memory_id, rows) if rows else []

    def get_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """The window, and what to pass as ``since`` to the next read of it.

        Messages an earlier read returned (``since`` is what it returned beside them) are
        reused rather than parsed again: only rows newer than that read are fetched whole.
        """
        key = _key(memory_id)
        conn = self._read_connection()
        statement = self._sql.read_since
        after = since.after if isinstance(since, WindowRead) else -1
        rows = conn.execute(statement, (key, after)).fetchall()
        read = window_since(rows, since, self._parser(memory_id, rows))
        if read is None:
            rows = conn.execute(statement, (key, -1)).fetchall()
            read = window_since(rows, None, self._parser(memory_id, rows))
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
        """In one transaction, remove the messages whose id is in ``removed`` (moving them to
        history with ``keep_history``), then append ``appended`` after every stored message.

        ``history_only`` left the window in the write that brought them: with
        ``keep_history`` they are recorded in history, as evicted, before ``appended``.
        ``since`` (what a read or a write returned) checks the write: if another writer has
        appended to the window or emptied it since, nothing changes and
        `ConcurrentChangeError` is raised. Returns the ``since`` for the next read and write.
        """
        key = _key(memory_id)
        passing = history_only if self.keep_history else ()
        # One check over both lists: an id may not be both recorded as passing and kept.
        appended_ids([*passing, *appended] if passing else appended, removed)
        conn = self._connection()
        with self._writing(conn):
            # The window's newest number: every append raises it, emptying drops it to -1.
            window_top, history_top = conn.execute(self._sql.top_seqs, (key,)).fetchone()
            if isinstance(since, WindowRead) and window_top != since.version:
                raise ConcurrentChangeError(memory_id)
            # Numbered after the rows removed too: a number is never given twice while the
            # conversation has rows, so a reader's mark never meets another message.
            last = max(window_top, history_top)
            if last < 0:
                last = self._first_seq()
            version = window_top
            if removed:
                self._evict(conn, key, list(removed))
            if passing:
                for m in passing:  # (the history table does not index ids)
                    if conn.execute(self._sql.has_id, (key, m.message_id)).fetchone():
                        raise duplicate_id_error(m.message_id, memory_id)
                when = _now()
                texts = [message_to_json(m) for m in passing]
                rows = self._rows(key, passing, texts, last=last)
                conn.executemany(self._sql.insert_history, [(*row, when) for row in rows])
                last += len(passing)
            if appended:
                self._append(conn, memory_id, key, appended, None, last=last)
                version = last + len(appended)
            elif removed:
                if not passing:
                    self._keep_last_seq(conn, key, last)
                (version,) = conn.execute(self._sql.window_top, (key,)).fetchone()
        if self.retention is not None and time.monotonic() >= self._next_purge:
            self._purge_by_retention()
        if isinstance(since, WindowRead):
            return since.at(version)
        return WindowRead(-1, [], [], version)

    def _last_seq(self, conn: sqlite3.Connection, key: str | bytes) -> int:
        """The number the next row follows: the conversation's last, window and history."""
        (last,) = conn.execute(self._sql.last_seq, (key,)).fetchone()
        return last if last >= 0 else self._first_seq()

    @staticmethod
    def _first_seq() -> int:
        """Where a conversation with no rows (new, or emptied) numbers from: the clock in
        microseconds. Numbers a reader holds from before it was emptied are lower, since
        writing them took longer than that."""
        return time.time_ns() // 1000

    def _keep_last_seq(self, conn: sqlite3.Connection, key: str | bytes, last: int) -> None:
        """After a write that removed rows and numbered none: make the highest row left
        hold ``last``, the number the next row follows, if the rows removed held it.

        Else the next write would number after the highest row left, giving a removed
        message's number again: a reader that holds that number would take the new message
        for the one it read. Moving the highest row up keeps the order, and a reader that
        holds the row knows it by its message id, its text unchanged. Only a write that
        removed the newest rows and added none pays for this, never a turn.
        """
        sql = self._sql
        window, history = conn.execute(sql.top_seqs, (key,)).fetchone()
        top = max(window, history)
        if 0 <= top < last:
            renumber = sql.renumber if window == top else sql.renumber_history
            conn.execute(renumber, (last, key, top))

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the window equal to ``messages``, writing only the difference.

        Stored messages missing from ``messages`` are removed (to history with
        ``keep_history``) and new ones appended. If the messages kept would change order, or
        a new one goes before one kept, the window's rows are written again.
        """
        key = _key(memory_id)
        new = with_message_ids(messages)
        check_unique_ids(new)
        texts = [message_to_json(m) for m in new]
        wanted = [(m.message_id, text) for m, text in zip(new, texts, strict=True)]
        conn = self._connection()
        with self._writing(conn):
            last = self._last_seq(conn, key)
            stored = conn.execute(self._sql.read_window, (key,)).fetchall()
            plan = plan_update(stored, wanted)
            if plan.removed or plan.changed:
                self._evict(conn, key, [*plan.removed, *plan.changed])
            if plan.rewrite:
                conn.executemany(self._sql.delete_one, [(key, mid) for mid in plan.staying])
            if plan.fresh < len(new):
                start = plan.fresh
                self._append(conn, memory_id, key, new[start:], texts[start:], last=last)
            elif plan.removed:
                self._keep_last_seq(conn, key, last)
        if self.retention is not None and time.monotonic() >= self._next_purge:
            self._purge_by_retention()

    def delete_messages(self, memory_id: Hashable) -> None:
        """Empty the window; with ``keep_history`` its messages stay in history, evicted."""
        key = _key(memory_id)
        conn = self._connection()
        sql = self._sql
        with self._writing(conn):
            if self.keep_history:
                # The rows keep their numbers in history: the last one stays held.
                conn.execute(sql.evict_all, (key, _now()))
                conn.execute(sql.delete_all, (key,))
            else:
                last = self._last_seq(conn, key)
                conn.execute(sql.delete_all, (key,))
                self._keep_last_seq(conn, key, last)  # history written earlier may be left

    # -- the same, for async callers ------------------------------------------------------
    # Run in order on this store's own thread (see _io_thread): while it is busy, calls
    # queue without a thread wake-up each, and their results reach the event loop together.
    # A write's timeout counts from when it was queued. In WAL mode a read never waits for
    # a write: while the thread's write has been waiting on a lock for a while, reads go to
    # a second thread rather than queue behind it.

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """`get_messages` on the store's thread."""
        return await self._reader().run(self.get_messages, memory_id)

    async def aget_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """`get_messages_since` on the store's thread."""
        return await self._reader().run(self.get_messages_since, memory_id, since)

    async def aapply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage] = (),
        since: object = None,
    ) -> object:
        """`apply_changes` on the store's thread: if the caller is cancelled, a call
        that has not started never runs, and one that has is waited for."""
        return await self._write(self._apply, memory_id, appended, removed, history_only, since)

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """`update_messages` on the store's thread."""
        await self._write(self.update_messages, memory_id, messages)

    async def adelete_messages(self, memory_id: Hashable) -> None:
        """`delete_messages` on the store's thread."""
        await self._write(self.delete_messages, memory_id)

    async def aget_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """`get_history` on the store's reading thread."""
        return await self._reader().run(self.get_history, memory_id)

    async def aforget(self, memory_id: Hashable) -> None:
        """`forget` on the store's thread."""
        await self._write(self.forget, memory_id)

    def _apply(
        self,
        memory_id: Hashable,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage],
        since: object,
    ) -> object:
        # Only the keywords given: a subclass that overrides apply_changes without
        # history_only= or since= takes the call.
        more: dict[str, Any] = {}
        if history_only:
            more["history_only"] = history_only
        if since is not None:
            more["since"] = since
        return self.apply_changes(memory_id, appended=appended, removed=removed, **more)

    def _io(self) -> IoThread:
        if self._closed:
            raise sqlite3.ProgrammingError(f"Cannot operate on a closed {self!r}")
        return self._io_thread

    def _reader(self) -> IoThread:
        thread = self._io()
        stalled = self._stalled_after
        return self._read_thread if stalled and time.monotonic() > stalled else thread

    async def _write(self, function: Callable[..., object], *args: Any) -> Any:
        return await self._io().run(self._timed, time.monotonic() + self._timeout, function, args)

    def _timed(
        self, deadline: float, function: Callable[..., object], args: tuple[Any, ...]
    ) -> Any:
        """``function(*args)`` on the store's thread, its writes begun by ``deadline``."""
        local = self._local
        local.deadline = deadline
        self._stalled_after = time.monotonic() + _STALLED
        try:
            return function(*args)
        finally:
            self._stalled_after = 0.0
            local.deadline = None

    # -- history -------------------------------------------------------------------------

    def get_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """Every message kept for ``memory_id``, in order: the history, then the window.

        Each entry's ``evicted_at`` says when it left the window (``None``: still in it).
        Without ``keep_history`` evicted messages are deleted, so only the window and any
        history written earlier by a store with ``keep_history`` remain.
        """
        key = _key(memory_id)
        rows = self._read_connection().execute(self._sql.read_history, (key, key)).fetchall()
        if not rows:
            return []
        messages = self._parse(memory_id, rows)
        entries = []
        for message, (seq, _, evicted_at) in zip(messages, rows, strict=True):
            try:
                when = None if evicted_at is None else datetime.fromisoformat(evicted_at)
            except (TypeError, ValueError):
                raise _corrupt(
                    memory_id, seq, f"evicted_at {evicted_at!r} is not a timestamp", self.table
                ) from None
            entries.append(HistoryEntry(message, when))
        return entries

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation's window and history."""
        key = _key(memory_id)
        conn = self._connection()
        sql = self._sql
        with self._writing(conn):
            conn.execute(sql.delete_all, (key,))
            conn.execute(sql.forget_history, (key,))

    # -- retention -----------------------------------------------------------------------

    def memory_ids(self) -> Iterator[Hashable]:
        """The ids of the conversations this store holds (window or history), each as it
        was given."""
        keys = [_key_text(key) for (key,) in self._read_connection().execute(self._sql.keys)]
        return map(memory_id_of, keys)

    def check_memory_id(self, memory_id: Hashable) -> None:
        """Raise ``ValueError`` if ``memory_id`` is too long for SQLite to hold.

        Any other id is held, whatever characters it has (a lone surrogate included). A
        memory calls this when it is made, so that an id that can't be stored fails before
        the model is called, not at the turn's write.
        """
        key = _key(memory_id)
        limit = self._max_length
        if len(key) * 4 <= limit:
            return  # no UTF-8 encoding is longer than 4 bytes a character
        size = len(key if isinstance(key, bytes) else key.encode())
        if size > limit:
            shown = repr(memory_id)
            shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
            raise ValueError(
                f"memory id {shown} takes {size} bytes as a key, more than the {limit} that "
                f"SQLite holds in one value (SQLITE_LIMIT_LENGTH) in {self.path!r}; use a "
                "shorter id (a hash of this one, say)"
            )

    def purge_idle(self, older_than: timedelta) -> int:
        """Delete every conversation idle for longer than ``older_than``; return how many.

        A conversation is idle since its last write: the newest message stored, or the
        newest eviction into history. Its window and its history go, as with
        `forget`. One transaction; it reads every row's time, so on a large file run
        it now and then, not every turn.
        """
        if not isinstance(older_than, timedelta):
            raise TypeError(f"older_than must be a timedelta, got {type(older_than).__name__}")
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, got {older_than!r}")
        now = datetime.now(UTC)
        cutoff = now - older_than
        stored_before = cutoff.timestamp()
        evicted_before = cutoff.isoformat(timespec="microseconds")
        conn = self._connection()
        sql = self._sql
        with self._writing(conn):
            keys = [
                (key,) for (key,) in conn.execute(sql.idle_keys, (stored_before, evicted_before))
            ]
            if keys:
                conn.executemany(sql.delete_all, keys)
                conn.executemany(sql.forget_history, keys)
        return len(keys)

    def _purge_by_retention(self) -> None:
        retention = self.retention
        assert retention is not None
        self._next_purge = time.monotonic() + purge_interval(retention)
        try:
            self.purge_idle(retention)
        except sqlite3.Error as error:
            # The write that got here has committed; a purge is housekeeping that the next
            # interval retries, and must not make the caller believe its write failed.
            _log.warning("%r: purging idle conversations failed: %s", self, error)

    def _parser(
        self, memory_id: Hashable, rows: Sequence[tuple[object, ...]]
    ) -> Callable[[list[int]], list[ChatMessage]]:
        # rows: (seq, message_id, message)
        def parse(indexes: list[int]) -> list[ChatMessage]:
            return self._parse(memory_id, [(rows[i][0], rows[i][2]) for i in indexes])

        return parse

    def _parse(self, memory_id: Hashable, rows: Sequence[tuple[object, ...]]) -> list[ChatMessage]:
        # rows: (seq, message, ...)
        def corrupt(i: int, reason: str) -> Exception:
            return _corrupt(memory_id, rows[i][0], reason, self.table)

        return self._cache.parse([row[1] for row in rows], corrupt)

    # -- inside a write transaction -------------------------------------------------------

    def _evict(self, conn: sqlite3.Connection, key: str | bytes, message_ids: list[str]) -> None:
        sql = self._sql
        message_ids = list(dict.fromkeys(message_ids))  # an id given twice is removed once
        if self.keep_history:
            when = _now()
            conn.executemany(sql.evict_one, [(key, mid, when) for mid in message_ids])
        conn.executemany(sql.delete_one, [(key, mid) for mid in message_ids])

    def _append(
        self,
        conn: sqlite3.Connection,
        memory_id: Hashable,
        key: str | bytes,
        messages: Sequence[ChatMessage],
        texts: Sequence[str] | None,
        *,
        last: int,
    ) -> None:
        sql = self._sql
        if texts is None:
            texts = [message_to_json(m) for m in messages]
        rows = self._rows(key, messages, texts, last=last)
        try:
            conn.executemany(sql.insert, rows)
            self._cache.remember(texts, messages)
        except sqlite3.IntegrityError as exc:
            if "message_id" not in str(exc):
                raise
            # The rows inserted before the clash are visible here: the clash is the first
            # message stored under another number than the one it was given.
            numbered = dict(conn.execute(sql.read_ids_with_seq, (key,)).fetchall())
            clash = next(
                (m.message_id for m, row in zip(messages, rows, strict=True)
                 if numbered.get(m.message_id, row[1]) != row[1]),
                messages[0].message_id,
            )  # fmt: skip
            raise duplicate_id_error(clash, memory_id) from None

    @staticmethod
    def _rows(
        key: str | bytes,
        messages: Sequence[ChatMessage],
        texts: Sequence[str],
        *,
        last: int,
    ) -> list[tuple[Any, ...]]:
        """The rows of ``messages`` (``texts`` their JSON), numbered after ``last``."""
        stored_at = time.time()
        return [
            (
                key,
                last + i,
                m.message_id,
                m.turn_id,
                None if m.created_at is None else m.created_at.isoformat(),
                stored_at,
                text,
            )
            for i, (m, text) in enumerate(zip(messages, texts, strict=True), 1)
        ]


class _Statements:
    # The SQL of one table, formatted once per store.
    __slots__ = (
        "create",
        "delete_all",
        "delete_one",
        "evict_all",
        "evict_one",
        "forget_history",
        "has_id",
        "idle_keys",
        "insert",
        "insert_history",
        "keys",
        "last_seq",
        "read",
        "read_history",
        "read_ids_only",
        "read_ids_with_seq",
        "read_since",
        "read_window",
        "renumber",
        "renumber_history",
        "schema",
        "top_seqs",
        "window_top",
    )

    def __init__(self, table: str) -> None:
        history = f"{table}_history"
        self.schema = f"{table}_schema"
        columns = """
            memory_key TEXT NOT NULL,
            seq INTEGER NOT NULL,
            message_id TEXT NOT NULL,
            turn_id TEXT,
            created_at TEXT,
            stored_at REAL NOT NULL,
            message TEXT NOT NULL"""
        self.create = (
            f"CREATE TABLE {self.schema} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
            f"CREATE TABLE {table} ({columns}, PRIMARY KEY (memory_key, seq)) WITHOUT ROWID",
            f"CREATE UNIQUE INDEX {table}_message_id ON {table} (memory_key, message_id)",
            f"CREATE TABLE {history} ({columns}, evicted_at TEXT NOT NULL, "
            "PRIMARY KEY (memory_key, seq)) WITHOUT ROWID",
        )
        self.keys = f"SELECT memory_key FROM {table} UNION SELECT memory_key FROM {history}"
        self.read = f"SELECT seq, message FROM {table} WHERE memory_key = ? ORDER BY seq"
        self.read_window = (
            f"SELECT message_id, message FROM {table} WHERE memory_key = ? ORDER BY seq"
        )
        self.read_ids_only = f"SELECT message_id FROM {table} WHERE memory_key = ?"
        self.read_ids_with_seq = f"SELECT message_id, seq FROM {table} WHERE memory_key = ?"
        self.has_id = f"SELECT 1 FROM {table} WHERE memory_key = ? AND message_id = ?"
        # Rows at or below ?2 were read before: their text is not fetched again.
        self.read_since = (
            f"SELECT seq, message_id, CASE WHEN seq > ?2 THEN message END FROM {table} "
            "WHERE memory_key = ?1 ORDER BY seq"
        )
        self.read_history = (
            f"SELECT seq, message, evicted_at FROM {history} WHERE memory_key = ? "
            f"UNION ALL SELECT seq, message, NULL FROM {table} WHERE memory_key = ? "
            "ORDER BY seq"
        )
        # Sequence numbers stay unique across window and history, so history keeps order.
        window_top = (
            f"coalesce((SELECT seq FROM {table} WHERE memory_key = ?1 "
            "ORDER BY seq DESC LIMIT 1), -1)"
        )
        history_top = (
            f"coalesce((SELECT seq FROM {history} WHERE memory_key = ?1 "
            "ORDER BY seq DESC LIMIT 1), -1)"
        )
        self.last_seq = f"SELECT max({window_top}, {history_top})"
        self.window_top = f"SELECT {window_top}"
        self.top_seqs = f"SELECT {window_top}, {history_top}"
        self.renumber = f"UPDATE {table} SET seq = ?1 WHERE memory_key = ?2 AND seq = ?3"
        self.renumber_history = f"UPDATE {history} SET seq = ?1 WHERE memory_key = ?2 AND seq = ?3"
        self.insert = f"INSERT INTO {table} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
        self.insert_history = (
            f"INSERT INTO {history} ({_COLUMNS}, evicted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.delete_one = f"DELETE FROM {table} WHERE memory_key = ? AND message_id = ?"
        self.delete_all = f"DELETE FROM {table} WHERE memory_key = ?"
        self.evict_one = (
            f"INSERT INTO {history} ({_COLUMNS}, evicted_at) SELECT {_COLUMNS}, ?3 "
            f"FROM {table} WHERE memory_key = ?1 AND message_id = ?2"
        )
        self.evict_all = (
            f"INSERT INTO {history} ({_COLUMNS}, evicted_at) SELECT {_COLUMNS}, ?2 "
            f"FROM {table} WHERE memory_key = ?1"
        )
        self.forget_history = f"DELETE FROM {history} WHERE memory_key = ?"
        # Keys whose newest write is older than both cut-offs: ?1 in unix seconds (stored_at),
        # ?2 in ISO 8601 UTC (evicted_at, written in one format, so text order is time order).
        self.idle_keys = (
            "SELECT memory_key FROM ("
            f"SELECT memory_key, max(stored_at) AS written, NULL AS evicted FROM {table} "
            "GROUP BY memory_key UNION ALL "
            f"SELECT memory_key, NULL, max(evicted_at) FROM {history} GROUP BY memory_key"
            ") GROUP BY memory_key "
            "HAVING coalesce(max(written), 0) < ?1 AND coalesce(max(evicted), '') < ?2"
        )


def _schema_version(conn: sqlite3.Connection, schema_table: str) -> int | None:
    if not _table_exists(conn, schema_table):
        return None
    row = conn.execute(f"SELECT value FROM {schema_table} WHERE name = 'version'").fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except ValueError:
        raise StoreSchemaError(
            f"table {schema_table!r} holds a schema version that is not a number: {row[0]!r}"
        ) from None


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None


def _corrupt(memory_id: Hashable, seq: object, reason: str, table: str) -> CorruptMessageError:
    key = _key(memory_id)
    literal = f"X'{key.hex()}'" if isinstance(key, bytes) else repr(key)
    return CorruptMessageError(
        memory_id,
        seq,
        reason,
        hint=(
            f"repair or delete the row with memory_key = {literal} and "
            f"seq = {seq} in table {table!r} (or {table}_history)"
        ),
    )


def _key(memory_id: Hashable) -> str | bytes:
    """The ``memory_key`` of a memory id: its ``store_key``, or, when that holds a lone
    surrogate (which SQLite text can't), the key's UTF-8 bytes with surrogates kept.

    A BLOB never equals a TEXT in SQLite, so such keys stay apart from every text key, and
    every key stored before stays as it was.
    """
    key = store_key(memory_id)
    if key.isascii():
        return key
    try:
        key.encode()
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogatepass")
    return key


def _key_text(key: str | bytes) -> str:
    """The ``store_key`` that ``_key`` filed as ``key``."""
    return key if isinstance(key, str) else key.decode("utf-8", "surrogatepass")


# SQLite's result codes for a file it can't open or write: SQLITE_PERM, SQLITE_READONLY,
# SQLITE_CANTOPEN, SQLITE_NOTADB.
_OPEN_ERRORS: Final = frozenset({3, 8, 14, 26})


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _locked(path: str, timeout: float, by: str) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(
        f"database is locked: {by} held {path!r} for the whole timeout ({timeout:g} s); "
        "try again, or make the store with a larger timeout="
    )
    error.sqlite_errorcode = _SQLITE_BUSY
    error.sqlite_errorname = "SQLITE_BUSY"
    return error


def _read_only_mount(folder: str) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def _open_error(path: str, error: sqlite3.DatabaseError | None) -> sqlite3.OperationalError:
    """The error for a database file that can't be opened for reading and writing: what
    SQLite said (``error``; ``None``: the file is read-only), with the path and why."""
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        reason = (
            "it is a directory; pass the path of a file in it, e.g. "
            f"{os.path.join(path, 'chat.db')!r}"
        )
    elif not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        reason = f"directory {folder!r} {what}; create it first, or pass another path"
    elif _read_only_mount(folder):
        reason = (
            f"the file system of {folder!r} is mounted read-only; pass a path on one that can "
            "be written"
        )
    elif os.path.exists(full) and not os.access(full, os.R_OK | os.W_OK):
        reason = "no permission to read and write it; change its permissions or pass another path"
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = (
            f"no permission to create files in directory {folder!r} (SQLite keeps its "
            "-wal and -shm files beside the database); change its permissions or pass another "
            "path"
        )
    elif error is not None and error.sqlite_errorcode & 0xFF == 26:
        reason = "the file is not a SQLite database; pass another path"
    else:
        reason = "check that the file and its directory can be read and written"
    said = "" if error is None else f" (SQLite said: {error})"
    opened = sqlite3.OperationalError(f"cannot open SQLite database {path!r}: {reason}{said}")
    opened.sqlite_errorcode = 8 if error is None else error.sqlite_errorcode
    opened.sqlite_errorname = "SQLITE_READONLY" if error is None else error.sqlite_errorname
    return opened
