"""Process CPU time per turn of an async service on SQLite (and PostgreSQL), against the floor.

Run by hand: ``python benchmarks/bench_async_turns.py`` (``--quick`` for a short run,
``--against REF`` to compare with a git ref of this project). 500 conversations of 10
turns each run at once (``asyncio.gather``), each turn one call of an ``async def`` method
of an ``ai_service`` with ``MessageWindowChatMemory.provider(max_messages=20, store=...)``
and a model whose ``achat`` sleeps 50 ms. Measured is the process's CPU time
(``time.process_time``, every thread) over the whole run, divided by the turns.

The floor makes the same turns with the driver alone, the same way round: read the
conversation's window, sleep 50 ms, write the user and AI messages (JSON texts) as two rows
in one transaction.

- SQLite: ``SqliteChatMemoryStore`` in a new file; the floor does an ``asyncio.to_thread``
  ``SELECT`` of the window's rows and an ``asyncio.to_thread`` ``INSERT`` of two rows in a
  ``BEGIN IMMEDIATE`` transaction, with sqlite3 (a connection per thread, WAL,
  ``synchronous=NORMAL``, as the store).
- PostgreSQL: ``PostgresChatMemoryStore`` (its async pool of 10 connections, in a new
  table); the floor does the ``SELECT`` and a two-row ``INSERT`` through a
  ``psycopg_pool.AsyncConnectionPool`` of 10 autocommit connections. The server's own CPU
  is not counted, only this process's.

Beside it, the context switches per turn (``getrusage``: voluntary and involuntary, every
thread): each hand-over between the event loop and a thread costs at least one, so they
count the hops a turn pays for, however the calls were batched.

Each contender is a process of its own, and rounds alternate between contenders and
between service and floor; each keeps its best round. The target: service / floor <= 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

from aiservices import (
    AiMessage,
    ChatRequest,
    ChatResponse,
    MemoryId,
    MessageWindowChatMemory,
    ai_service,
)
from aiservices.stores import SqliteChatMemoryStore

POSTGRES_DSN = os.environ.get(
    "AISERVICES_BENCH_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)

CONVERSATIONS = 500
TURNS = 10
WINDOW = 20
DELAY = 0.05  # the model's answer, and the floor's stand-in for it
ANSWER = "It is sunny in Paris today, 21 degrees, with a light breeze from the west."
BOUND = 1.5
STORES = ("sqlite", "postgres")


def question(c: int, t: int) -> str:
    return f"Conversation {c}, question {t}: what is the weather like in Paris today?"


class Chat(Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class SleepingModel:
    """Answers the same text after ``DELAY`` seconds."""

    def __init__(self) -> None:
        self.response = ChatResponse(AiMessage(ANSWER))

    def chat(self, request: ChatRequest) -> ChatResponse:
        time.sleep(DELAY)
        return self.response

    async def achat(self, request: ChatRequest) -> ChatResponse:
        await asyncio.sleep(DELAY)
        return self.response


Timing = tuple[float, float, float]


def switches() -> int:
    """Context switches of every thread of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def timed(
    turns: Callable[[int], Awaitable[None]], conversations: int, after: Callable[[], Awaitable[Any]]
) -> Timing:
    """CPU microseconds per turn, wall seconds, and context switches per turn, of all
    conversations run at once."""

    async def run() -> Timing:
        wall, cpu, switched = time.perf_counter(), time.process_time(), switches()
        await asyncio.gather(*(turns(c) for c in range(conversations)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        switched = switches() - switched
        await after()
        count = conversations * TURNS
        return cpu / count * 1e6, wall, switched / count

    gc.collect()
    return asyncio.run(run())


def message_json(kind: str, text: str) -> str:
    """A message as a row keeps it: its type, id, time and text."""
    return json.dumps(
        {
            "type": kind,
            "message_id": uuid.uuid4().hex,
            "created_at": datetime.now(UTC).isoformat(),
            "text": text,
        }
    )


async def nothing() -> None:
    return None


# -- SQLite ------------------------------------------------------------------------------


def sqlite_service(conversations: int) -> Timing:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteChatMemoryStore(Path(tmp) / "turns.db")
        service = ai_service(
            Chat,
            model=SleepingModel(),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=WINDOW, store=store),
        )

        async def conversation(c: int) -> None:
            for t in range(TURNS):
                await service.chat(f"user-{c}", question(c, t))

        try:
            found = timed(conversation, conversations, nothing)
            assert len(store.get_messages(f"user-{conversations - 1}")) == 2 * TURNS
        finally:
            store.close()
        return found


class SqliteFloor:
    """A table of (conversation, seq, message) rows; a connection per thread, as the store."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.local = threading.local()
        self.write_lock = threading.Lock()
        self.connections: list[sqlite3.Connection] = []
        self.connection().execute(
            "CREATE TABLE messages (conv TEXT NOT NULL, seq INTEGER NOT NULL, "
            "message TEXT NOT NULL, PRIMARY KEY (conv, seq)) WITHOUT ROWID"
        )

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self.local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self.local.conn = conn
            self.connections.append(conn)
        return conn

    def read(self, conv: str) -> list[Any]:
        return (
            self.connection()
            .execute(
                "SELECT message FROM messages WHERE conv = ? ORDER BY seq DESC LIMIT ?",
                (conv, WINDOW),
            )
            .fetchall()
        )

    def write(self, conv: str, seq: int, user: str, ai: str) -> None:
        conn = self.connection()
        with self.write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO messages VALUES (?, ?, ?)",
                    [(conv, seq, user), (conv, seq + 1, ai)],
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        for conn in self.connections:
            conn.close()


def sqlite_floor(conversations: int) -> Timing:
    with tempfile.TemporaryDirectory() as tmp:
        floor = SqliteFloor(str(Path(tmp) / "floor.db"))

        async def conversation(c: int) -> None:
            conv = f"user-{c}"
            for t in range(TURNS):
                await asyncio.to_thread(floor.read, conv)
                await asyncio.sleep(DELAY)
                user, ai = message_json("user", question(c, t)), message_json("ai", ANSWER)
                await asyncio.to_thread(floor.write, conv, 2 * t, user, ai)

        try:
            found = timed(conversation, conversations, nothing)
            assert len(floor.read(f"user-{conversations - 1}")) == 2 * TURNS
        finally:
            floor.close()
        return found


# -- PostgreSQL --------------------------------------------------------------------------


def drop_tables(table: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
        for suffix in ("", "_history", "_conversations", "_schema"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table + suffix)))


def postgres_service(conversations: int) -> Timing:
    from aiservices.stores import PostgresChatMemoryStore

    table = f"bench_{uuid.uuid4().hex}"
    try:
        store = PostgresChatMemoryStore(POSTGRES_DSN, table=table)
        store.create_schema()
        service = ai_service(
            Chat,
            model=SleepingModel(),
            chat_memory_provider=MessageWindowChatMemory.provider(max_messages=WINDOW, store=store),
        )

        async def conversation(c: int) -> None:
            for t in range(TURNS):
                await service.chat(f"user-{c}", question(c, t))

        try:
            found = timed(conversation, conversations, store.aclose)
        finally:
            store.close()
        with PostgresChatMemoryStore(POSTGRES_DSN, table=table) as check:
            assert len(check.get_messages(f"user-{conversations - 1}")) == 2 * TURNS
        return found
    finally:
        drop_tables(table)


def postgres_floor(conversations: int) -> Timing:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool

    table = f"bench_{uuid.uuid4().hex}"
    name = sql.Identifier(table)
    select = sql.SQL("SELECT message FROM {} WHERE conv = %s ORDER BY seq DESC LIMIT %s").format(
        name
    )
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s), (%s, %s, %s)").format(name)
    try:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (conv text NOT NULL, seq bigint NOT NULL, "
                    "message text NOT NULL, PRIMARY KEY (conv, seq))"
                ).format(name)
            )
        pools: list[AsyncConnectionPool[Any]] = []

        async def pool() -> AsyncConnectionPool[Any]:
            if not pools:  # made and opened on first use, as the store's is
                pools.append(
                    AsyncConnectionPool(
                        POSTGRES_DSN,
                        min_size=1,
                        max_size=10,
                        kwargs={"autocommit": True},
                        open=False,
                    )
                )
                await pools[0].open()
            return pools[0]

        async def conversation(c: int) -> None:
            conv = f"user-{c}"
            for t in range(TURNS):
                async with (await pool()).connection() as conn:
                    await (await conn.execute(select, (conv, WINDOW))).fetchall()
                await asyncio.sleep(DELAY)
                user, ai = message_json("user", question(c, t)), message_json("ai", ANSWER)
                async with (await pool()).connection() as conn:
                    await conn.execute(insert, (conv, 2 * t, user, conv, 2 * t + 1, ai))

        async def close() -> None:
            for p in pools:
                await p.close()

        found = timed(conversation, conversations, close)
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            rows = conn.execute(select, (f"user-{conversations - 1}", WINDOW)).fetchall()
            assert len(rows) == 2 * TURNS
        return found
    finally:
        drop_tables(table)


def postgres_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(POSTGRES_DSN, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        print(f"postgres: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
        return False
    return True


RUNS: dict[str, Callable[[int], Timing]] = {
    "sqlite-service": sqlite_service,
    "sqlite-floor": sqlite_floor,
    "postgres-service": postgres_service,
    "postgres-floor": postgres_floor,
}


def serve(stores: list[str]) -> None:
    """The worker's side: answer "scenario conversations" lines with a `Timing`."""
    if "postgres" in stores and not postgres_available():
        stores = [s for s in stores if s != "postgres"]
    names = [name for name in RUNS if name.split("-")[0] in stores]
    for name in names:
        RUNS[name](10)  # warm up: the first call of a service imports and builds what it uses
    out = sys.stdout
    out.write(json.dumps(names) + "\n")
    out.flush()
    for line in sys.stdin:
        name, n = line.split()
        out.write(json.dumps(RUNS[name](int(n))) + "\n")
        out.flush()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--against", action="append", default=[], metavar="REF", help="a git ref to compare"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run: 2 rounds of 100 conversations"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5)")
    parser.add_argument(
        "--conversations", type=int, help=f"conversations at once (default {CONVERSATIONS})"
    )
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated")
    args = parser.parse_args()
    stores = args.stores.split(",")
    if set(stores) - set(STORES):
        parser.error(f"--stores: of {', '.join(STORES)}")
    if args.worker is not None:
        serve(args.worker.split(","))
        return 0

    from bench_stores import interleaved

    rounds = args.rounds or (2 if args.quick else 5)
    conversations = args.conversations or (100 if args.quick else CONVERSATIONS)
    plan = [(f"{store}-{kind}", conversations) for store in stores for kind in ("service", "floor")]
    results, _ = interleaved(__file__, args.against, ",".join(stores), rounds, plan)

    print(
        f"\n{conversations} conversations x {TURNS} turns at once, model {DELAY * 1000:.0f} ms: "
        f"process CPU per turn (us), best of {rounds} rounds; the ratio of the best rounds, "
        "[range over rounds]; wall seconds and context switches per turn of the best round"
    )
    print(
        f"{'contender':<12} {'store':<9} {'service':>9} {'floor':>9} {'service/floor':>22}"
        f" {'wall s, service floor':>22} {'switches, service floor':>24}"
    )
    for label, table in results.items():
        for store in stores:
            service = table.get(f"{store}-service", [])
            floor = table.get(f"{store}-floor", [])
            if not service or not floor:
                continue
            best_s, best_f = min(service), min(floor)
            ratio = best_s[0] / best_f[0]
            each = [s[0] / f[0] for s, f in zip(service, floor, strict=True)]
            verdict = "ok" if ratio <= BOUND else f"OVER {BOUND}"
            print(
                f"{label:<12} {store:<9} {best_s[0]:>9.1f} {best_f[0]:>9.1f}"
                f" {ratio:>6.2f} [{min(each):.2f}-{max(each):.2f}] {verdict:<8}"
                f" {best_s[1]:>13.2f} {best_f[1]:>6.2f}"
                f" {best_s[2]:>15.2f} {best_f[2]:>8.2f}"
            )
    for label in [x for x in results if x != "this"]:
        print(f"\nthis / {label} (best rounds, service CPU per turn)")
        for store in stores:
            mine = results["this"].get(f"{store}-service")
            theirs = results[label].get(f"{store}-service")
            if mine and theirs:
                print(f"  {store:<9} {min(mine)[0] / min(theirs)[0]:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
