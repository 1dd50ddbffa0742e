"""Stores whose async methods run their sync ones in a worker thread: PostgreSQL given a pool
without an async one, Redis given a client without an async one.

A thread can't be stopped. A caller cancelled while the thread writes must hear of it only
once the write has ended, so that the memory's lock is not let go while the write still
lands, and the next caller sees what the store holds.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql
from psycopg_pool import ConnectionPool

from aiservices import MessageWindowChatMemory
from aiservices.messages import UserMessage
from aiservices.stores.postgres import PostgresChatMemoryStore
from aiservices.stores.redis import RedisChatMemoryStore

from ._messages import texts
from ._server_backends import drop_postgres_tables, drop_redis_keys, require_postgres, require_redis

HELD = "second"  # the text of the message whose write is held up


@dataclass
class Held:
    """A store, and how to hold up its write of the message ``HELD`` and let it go."""

    store: Any
    hold: Callable[[], None]
    started: Callable[[], Awaitable[None]]  # returns once the held write waits
    release: Callable[[], None]


class HeldClient(redis.Redis):
    """A client that, while ``hold`` is set, keeps a command carrying ``HELD`` waiting."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.hold = threading.Event()
        self.waiting = threading.Event()
        self.go = threading.Event()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.hold.is_set() and any(isinstance(a, str) and HELD in a for a in args):
            self.waiting.set()
            self.go.wait(10)
        return super().execute_command(*args, **options)


def _redis(url: str) -> Iterator[Held]:
    prefix = f"test:{uuid.uuid4().hex}:"
    client = HeldClient(**redis.connection.parse_url(url))
    store = RedisChatMemoryStore(client, key_prefix=prefix)

    async def started() -> None:
        assert await asyncio.to_thread(client.waiting.wait, 10)

    try:
        yield Held(store, client.hold.set, started, client.go.set)
    finally:
        client.go.set()
        client.close()
        drop_redis_keys(url, prefix)


def _postgres(dsn: str) -> Iterator[Held]:
    table = f"t_{uuid.uuid4().hex}"
    pool: ConnectionPool[Any] = ConnectionPool(dsn, kwargs={"autocommit": True}, open=True)
    store = PostgresChatMemoryStore(pool, table=table)
    blocker = psycopg.connect(dsn)
    conversations = sql.Identifier(f"{table}_conversations")

    def hold() -> None:
        # Another session holds the conversation's row: the next write waits for it.
        blocker.execute(sql.SQL("SELECT 1 FROM {} FOR UPDATE").format(conversations))

    def waiting() -> None:
        with psycopg.connect(dsn, autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while True:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                if row is not None and row[0] >= 1:
                    return
                assert time.monotonic() < deadline, "the write never waited for the lock"
                time.sleep(0.02)

    async def started() -> None:
        await asyncio.to_thread(waiting)

    try:
        yield Held(store, hold, started, blocker.rollback)
    finally:
        blocker.close()
        store.close()
        pool.close()
        drop_postgres_tables(dsn, table)


@pytest.fixture(params=["postgres", "redis"])
def held(request: pytest.FixtureRequest) -> Iterator[Held]:
    if request.param == "postgres":
        yield from _postgres(require_postgres())
    else:
        yield from _redis(require_redis())


async def test_the_async_methods_run_in_a_worker_thread(held: Held) -> None:
    # What the rest of this file relies on: no async pool or client to use instead.
    store = held.store
    await store.aapply_changes("c", appended=[UserMessage("a", message_id="1")], removed=[])
    assert texts(await store.aget_messages("c")) == ["a"]
    assert getattr(store, "_async_pool", None) is None
    assert getattr(store, "_async_client", None) is None


async def test_a_write_cancelled_in_its_thread_is_waited_for_and_seen(held: Held) -> None:
    memory = MessageWindowChatMemory(10, id="c", store=held.store)
    await memory.aadd(UserMessage("first"))
    held.hold()
    writer = asyncio.create_task(memory.aadd(UserMessage(HELD)))
    await held.started()
    writer.cancel()
    reader = asyncio.create_task(memory.amessages())  # queues on the memory's lock
    await asyncio.sleep(0.2)
    # The write still runs in its thread: its caller is not told yet, and the memory's
    # lock is still held, so the next caller can't read a conversation about to change.
    assert not writer.done()
    assert not reader.done()
    held.release()
    with pytest.raises(asyncio.CancelledError):
        await writer
    # The write landed before the caller heard of the cancellation: everyone sees it.
    assert texts(await reader) == ["first", HELD]
    assert texts(await held.store.aget_messages("c")) == ["first", HELD]
    assert texts(await memory.amessages()) == ["first", HELD]


async def test_a_call_cancelled_twice_is_still_waited_for(held: Held) -> None:
    store = held.store
    await store.aapply_changes("c", appended=[UserMessage("first", message_id="1")], removed=[])
    held.hold()
    call = asyncio.create_task(
        store.aapply_changes("c", appended=[UserMessage(HELD, message_id="2")], removed=[])
    )
    await held.started()
    call.cancel()
    await asyncio.sleep(0.1)
    call.cancel()
    await asyncio.sleep(0.1)
    assert not call.done()
    held.release()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert texts(await store.aget_messages("c")) == ["first", HELD]
