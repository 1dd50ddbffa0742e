"""Whole-conversation reads against the raw driver, and store latency by window size.

Run by hand. The default run, ``python benchmarks/bench_stores.py``, times the read of a
conversation of 1,000 messages on SQLite, Redis and PostgreSQL, three ways:

- ``raw``: the driver's own read of the same rows: a sqlite3 ``SELECT`` of the message
  texts in order, a Redis ``LRANGE`` of the window's list, a psycopg ``SELECT`` through a
  ``psycopg_pool.ConnectionPool``. It reads the store's own rows when their layout is the
  one known here (``{table}``'s ``memory_key``/``seq``/``message`` columns; the list key
  ``store.keys(id)[0]``), else a copy of the same texts laid out that way ("copy" in the
  table);
- ``store``: ``store.get_messages(id)``;
- ``memory``: ``MessageWindowChatMemory(max_messages=2000, id=..., store=store).messages()``,
  one memory per conversation, kept across reads as a service keeps them.

Reads go round-robin over 32 conversations (each unchanged since it was last read), then
over 1. It prints each read's time and the ratios store / raw and memory / raw. Each
contender is a process of its own: this checkout and, with ``--against REF``, a git ref of
it; rounds alternate between contenders and between the three reads, and each keeps its
best round (the median read of a round). Compare the ratios, not the absolute times.

    python benchmarks/bench_stores.py --against HEAD~1
    python benchmarks/bench_stores.py --quick --stores sqlite

``--sizes`` runs instead the older, single-process table (this checkout only): per-turn
write (``apply_changes``, 2 appended and 2 removed), read and ``update_messages`` with
windows of 10, 1,000 and 10,000 messages, and turns per second with 8 threads.

Redis and PostgreSQL are found at ``AISERVICES_BENCH_REDIS_URL`` and
``AISERVICES_BENCH_POSTGRES_DSN`` (defaults: 127.0.0.1, database ``test``); a store whose
server does not answer is skipped.
"""

from __future__ import annotations

import argparse
import functools
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from aiservices import AiMessage, ChatMessage, MessageWindowChatMemory, UserMessage
from aiservices.stores import InMemoryChatMemoryStore, SqliteChatMemoryStore, store_key

REDIS_URL = os.environ.get("AISERVICES_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get(
    "AISERVICES_BENCH_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)

READ_STORES = ("sqlite", "redis", "postgres")
CONVERSATIONS = 32  # active conversations in the first table
MESSAGES = 1000  # in each conversation
KINDS = ("raw", "store", "memory")


def new_id() -> str:
    return uuid.uuid4().hex


def message_json(message: ChatMessage) -> str:
    """The text a store keeps for a message (one JSON object, its type tag first)."""
    return message.model_dump_json(exclude_none=True)


def turn_messages(turn: int, tag: str = "") -> list[ChatMessage]:
    question = f"{tag}Question number {turn}: what is the weather like in Paris today?"
    answer = f"{tag}Answer {turn}: it is sunny in Paris, 21 degrees, with a light breeze."
    return [UserMessage(question, message_id=new_id()), AiMessage(answer, message_id=new_id())]


# -- whole-conversation reads, interleaved ---------------------------------------------

RawRead = Callable[[str], Any]


def sqlite_reads(
    stack: ExitStack, conversations: dict[str, list[ChatMessage]]
) -> tuple[Any, RawRead, str]:
    tmp = stack.enter_context(tempfile.TemporaryDirectory())
    path = str(Path(tmp) / "reads.db")
    store = stack.enter_context(SqliteChatMemoryStore(path))
    for memory_id, messages in conversations.items():
        store.update_messages(memory_id, messages)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    stack.callback(conn.close)
    table = getattr(store, "table", None)
    columns = (
        {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
        if isinstance(table, str)
        else set()
    )
    if {"memory_key", "seq", "message"} <= columns:
        select = f'SELECT message FROM "{table}" WHERE memory_key = ? ORDER BY seq'
        first = next(iter(conversations))
        if len(conn.execute(select, (store_key(first),)).fetchall()) == MESSAGES:
            return store, lambda key: conn.execute(select, (key,)).fetchall(), "rows"
    conn.execute(
        "CREATE TABLE bench_copy (memory_key TEXT, seq INTEGER, message TEXT, "
        "PRIMARY KEY (memory_key, seq)) WITHOUT ROWID"
    )
    for memory_id, messages in conversations.items():
        rows = [(store_key(memory_id), i, message_json(m)) for i, m in enumerate(messages)]
        conn.executemany("INSERT INTO bench_copy VALUES (?, ?, ?)", rows)
    select = "SELECT message FROM bench_copy WHERE memory_key = ? ORDER BY seq"
    return store, lambda key: conn.execute(select, (key,)).fetchall(), "copy"


def redis_reads(
    stack: ExitStack, conversations: dict[str, list[ChatMessage]]
) -> tuple[Any, RawRead, str]:
    import redis

    from aiservices.stores import RedisChatMemoryStore

    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    prefix = f"bench:{new_id()}:"

    def clean() -> None:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()

    stack.callback(clean)
    store = stack.enter_context(RedisChatMemoryStore(REDIS_URL, key_prefix=prefix))
    for memory_id, messages in conversations.items():
        store.update_messages(memory_id, messages)
    keys = getattr(store, "keys", None)
    if callable(keys):
        window: dict[str, str] = {}
        for memory_id in conversations:
            key = keys(memory_id)[0]
            if client.type(key) != b"list" or client.llen(key) != MESSAGES:
                break
            window[store_key(memory_id)] = key
        else:
            return store, lambda key: client.lrange(window[key], 0, -1), "rows"
    copy: dict[str, str] = {}
    for memory_id, messages in conversations.items():
        key = copy[store_key(memory_id)] = f"{prefix}copy:{memory_id}"
        client.rpush(key, *(message_json(m) for m in messages))
    return store, lambda key: client.lrange(copy[key], 0, -1), "copy"


def postgres_reads(
    stack: ExitStack, conversations: dict[str, list[ChatMessage]]
) -> tuple[Any, RawRead, str]:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool

    from aiservices.stores import PostgresChatMemoryStore

    with psycopg.connect(POSTGRES_DSN, connect_timeout=5) as probe:
        probe.execute("SELECT 1")
    table = f"bench_{new_id()}"

    def drop() -> None:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            for suffix in ("", "_history", "_conversations", "_schema", "_copy"):
                name = sql.Identifier(table + suffix)
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))

    stack.callback(drop)
    store = stack.enter_context(PostgresChatMemoryStore(POSTGRES_DSN, table=table))
    for memory_id, messages in conversations.items():
        store.update_messages(memory_id, messages)
    pool = ConnectionPool(
        POSTGRES_DSN, min_size=1, max_size=10, kwargs={"autocommit": True}, open=True
    )
    stack.callback(pool.close)
    pool.wait()

    def reader(name: str) -> RawRead:
        select = sql.SQL("SELECT message FROM {} WHERE memory_key = %s ORDER BY seq").format(
            sql.Identifier(name)
        )

        def read(key: str) -> Any:
            with pool.connection() as conn:
                return conn.execute(select, (key,)).fetchall()

        return read

    with pool.connection() as conn:
        columns = {
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
                (table,),
            )
        }
    if {"memory_key", "seq", "message"} <= columns:
        read = reader(table)
        if len(read(store_key(next(iter(conversations))))) == MESSAGES:
            return store, read, "rows"
    copy = table + "_copy"
    with pool.connection() as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (memory_key text, seq bigint, message text, "
                "PRIMARY KEY (memory_key, seq))"
            ).format(sql.Identifier(copy))
        )
        insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(sql.Identifier(copy))
        with conn.cursor() as cursor:
            for memory_id, messages in conversations.items():
                rows = [(store_key(memory_id), i, message_json(m)) for i, m in enumerate(messages)]
                cursor.executemany(insert, rows)
    return store, reader(copy), "copy"


READERS = {"sqlite": sqlite_reads, "redis": redis_reads, "postgres": postgres_reads}


def read_scenarios(stack: ExitStack, stores: Sequence[str]) -> dict[str, Callable[[int], Any]]:
    """Each store's raw, store and memory reads, over 32 conversations and over 1."""
    table: dict[str, Callable[[int], Any]] = {}
    ids = [f"conversation-{c}" for c in range(CONVERSATIONS)]
    for name in stores:
        # New messages for each store: their ids and texts are the store's alone.
        conversations = {
            memory_id: [m for t in range(MESSAGES // 2) for m in turn_messages(t, f"[{c}] ")]
            for c, memory_id in enumerate(ids)
        }
        try:
            store, raw, layout = READERS[name](stack, conversations)
        except Exception as exc:
            print(f"{name}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        del conversations
        memories = [MessageWindowChatMemory(2000, id=memory_id, store=store) for memory_id in ids]
        keys = [store_key(memory_id) for memory_id in ids]
        for memory, key in zip(memories, keys, strict=True):
            assert len(memory.messages()) == MESSAGES
            assert len(raw(key)) == MESSAGES
        for active in (CONVERSATIONS, 1):

            def raw_read(
                i: int, active: int = active, raw: RawRead = raw, keys: list[str] = keys
            ) -> Any:
                return raw(keys[i % active])

            def store_read(i: int, active: int = active, store: Any = store) -> Any:
                return store.get_messages(ids[i % active])

            def memory_read(i: int, active: int = active, memories: Any = memories) -> Any:
                return memories[i % active].messages()

            table[f"{name}-raw-{active}"] = raw_read
            table[f"{name}-store-{active}"] = store_read
            table[f"{name}-memory-{active}"] = memory_read
        table[f"{name}-layout-{layout}"] = lambda i: None
    return table


# -- the interleaved run ----------------------------------------------------------------

Rounds = dict[str, dict[str, list[tuple[float, ...]]]]  # a worker's figures, round by round


def interleaved(
    script: str,
    against: Sequence[str],
    contender: str,
    rounds: int,
    plan: Sequence[tuple[str, int]],
) -> tuple[Rounds, dict[str, list[str]]]:
    """Every round, each planned scenario in turn, measured in each contender's process
    (the order of the contenders turning every round); the measurements of every round."""
    from _interleave import ROOT, Worker, export

    with tempfile.TemporaryDirectory() as temporary:
        contenders: list[tuple[str, Path]] = [("this", ROOT)]
        contenders += [(ref, export(ref, Path(temporary))) for ref in against]
        workers: list[Worker] = []
        try:
            for label, path in contenders:
                print(f"{label}: preparing", file=sys.stderr, flush=True)
                workers.append(Worker(Path(script).resolve(), label, contender, path))
            results: Rounds = {w.label: {} for w in workers}
            for r in range(rounds):
                print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
                for name, n in plan:
                    turn = r % len(workers)
                    for worker in workers[turn:] + workers[:turn]:
                        if name in worker.names:
                            found = worker.measure(name, n)
                            results[worker.label].setdefault(name, []).append(found)
        finally:
            for worker in workers:
                worker.close()
    return results, {w.label: w.names for w in workers}


def ratio_cell(times: Sequence[float], floor: Sequence[float]) -> str:
    """The ratio of the best rounds, then the range of the rounds' own ratios."""
    each = [a / b for a, b in zip(times, floor, strict=True)]
    return f"{min(times) / min(floor):6.2f} [{min(each):.2f}-{max(each):.2f}]"


def report_reads(results: Rounds, names: dict[str, list[str]], rounds: int, n: int) -> None:
    print(
        f"\nWhole-conversation read, {MESSAGES} messages: best of {rounds} rounds, each the "
        f"median of {n} reads (ms); ratio of the best rounds, [range over rounds]"
    )
    print(
        f"{'contender':<12} {'store':<9} {'active':>6} {'raw':>8} {'store':>8} {'memory':>8}"
        f" {'store/raw':>20} {'memory/raw':>20}"
    )
    for label, table in results.items():
        for store in READ_STORES:
            layout = next(
                (x.rsplit("-", 1)[1] for x in names[label] if x.startswith(f"{store}-layout-")),
                "",
            )
            for active in (CONVERSATIONS, 1):
                found = [table.get(f"{store}-{kind}-{active}", []) for kind in KINDS]
                if not all(found):
                    continue
                raw, got, mem = ([m[0] for m in measured] for measured in found)
                ratio = [ratio_cell(x, raw) for x in (got, mem)]
                tag = f"{store} {layout}" if layout == "copy" else store
                print(
                    f"{label:<12} {tag:<9} {active:>6} {min(raw) / 1000:>8.3f}"
                    f" {min(got) / 1000:>8.3f} {min(mem) / 1000:>8.3f}"
                    f" {ratio[0]:>20} {ratio[1]:>20}"
                )
    others = [label for label in results if label != "this"]
    for label in others:
        print(f"\nthis / {label} (best rounds)")
        for store in READ_STORES:
            for active in (CONVERSATIONS, 1):
                cells = []
                for kind in ("store", "memory"):
                    name = f"{store}-{kind}-{active}"
                    mine, theirs = results["this"].get(name), results[label].get(name)
                    if mine and theirs:
                        best = min(m[0] for m in mine) / min(m[0] for m in theirs)
                        cells.append(f"{kind} {best:5.2f}")
                if cells:
                    print(f"  {store:<9} {active:>3} active: {'   '.join(cells)}")


def serve_reads(contender: str) -> None:
    from _interleave import serve

    stores = contender.split(",")
    with ExitStack() as stack:
        serve(lambda _: read_scenarios(stack, stores), contender)


# -- per-window-size table (--sizes), this checkout only --------------------------------


@contextmanager
def in_memory() -> Iterator[Any]:
    yield InMemoryChatMemoryStore()


@contextmanager
def sqlite() -> Iterator[Any]:
    with tempfile.TemporaryDirectory() as tmp, SqliteChatMemoryStore(Path(tmp) / "b.db") as s:
        yield s


@contextmanager
def sqlite_history() -> Iterator[Any]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        SqliteChatMemoryStore(Path(tmp) / "b.db", keep_history=True) as s,
    ):
        yield s


@contextmanager
def redis_store(**options: Any) -> Iterator[Any]:
    import redis

    from aiservices.stores import RedisChatMemoryStore

    prefix = f"bench:{new_id()}:"
    try:
        with RedisChatMemoryStore(REDIS_URL, key_prefix=prefix, **options) as s:
            yield s
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()


@contextmanager
def postgres_store(**options: Any) -> Iterator[Any]:
    import psycopg
    from psycopg import sql

    from aiservices.stores import PostgresChatMemoryStore

    table = f"bench_{new_id()}"
    try:
        with PostgresChatMemoryStore(POSTGRES_DSN, table=table, **options) as s:
            yield s
    finally:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            for suffix in ("", "_history", "_conversations", "_schema"):
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table + suffix))
                )


STORES: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "in_memory": in_memory,
    "sqlite": sqlite,
    "sqlite keep_history": sqlite_history,
    "redis": redis_store,
    "redis keep_history": functools.partial(redis_store, keep_history=True),
    "postgres": postgres_store,
    "postgres keep_history": functools.partial(postgres_store, keep_history=True),
}


def fill(store: Any, memory_id: str, size: int) -> list[ChatMessage]:
    """Store a conversation of ``size`` messages under ``memory_id``."""
    window: list[ChatMessage] = []
    for turn in range(size // 2):
        window += turn_messages(turn)
    store.update_messages(memory_id, window)
    return window


class Window:
    """One conversation at capacity, turned over by each measured turn."""

    def __init__(self, store: Any, size: int) -> None:
        self.store = store
        self.memory_id = f"window-{size}-{new_id()}"
        self.messages = fill(store, self.memory_id, size)
        self.turn = size

    def write_turns(self, turns: int) -> float:
        """Seconds per turn written with apply_changes: 2 appended, the 2 oldest removed."""
        new_turns = [turn_messages(self.turn + t) for t in range(turns)]
        self.turn += turns
        # What each turn removes is worked out before the clock starts.
        sequence = self.messages + [m for new in new_turns for m in new]
        removals = [[m.message_id for m in sequence[2 * t : 2 * t + 2]] for t in range(turns)]
        store, memory_id = self.store, self.memory_id
        start = time.perf_counter()
        for new, removed in zip(new_turns, removals, strict=True):
            store.apply_changes(memory_id, appended=new, removed=removed)
        elapsed = time.perf_counter() - start
        self.messages = sequence[2 * turns :]
        return elapsed / turns

    def update_turns(self, turns: int) -> float:
        """Seconds per turn written with update_messages (the whole window given)."""
        new_turns = [turn_messages(self.turn + t) for t in range(turns)]
        self.turn += turns
        store, memory_id = self.store, self.memory_id
        start = time.perf_counter()
        for new in new_turns:
            self.messages = self.messages[2:] + new
            store.update_messages(memory_id, self.messages)
        return (time.perf_counter() - start) / turns

    def reads(self, reads: int) -> float:
        """Seconds per get_messages of the whole window."""
        store, memory_id = self.store, self.memory_id
        start = time.perf_counter()
        for _ in range(reads):
            store.get_messages(memory_id)
        return (time.perf_counter() - start) / reads


def concurrent_turns(store: Any, threads: int, turns: int, size: int = 20) -> float:
    """Turns per second (a read and a write each) of ``threads`` threads on distinct ids."""
    windows = [Window(store, size) for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def work(window: Window) -> None:
        new_turns = [turn_messages(size + t) for t in range(turns)]
        sequence = window.messages + [m for new in new_turns for m in new]
        removals = [[m.message_id for m in sequence[2 * t : 2 * t + 2]] for t in range(turns)]
        store, memory_id = window.store, window.memory_id
        barrier.wait()
        for new, removed in zip(new_turns, removals, strict=True):
            store.get_messages(memory_id)
            store.apply_changes(memory_id, appended=new, removed=removed)

    pool = [threading.Thread(target=work, args=(w,)) for w in windows]
    for t in pool:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    return threads * turns / (time.perf_counter() - start)


SIZES = (10, 1000, 10_000)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} us"


def measure_sizes(store: Any, block: int, blocks: int) -> None:
    # Other conversations in the file, as in real use: a 10-message window alone would fit
    # in one page of a fresh SQLite file, which flatters it.
    for _ in range(200):
        fill(store, f"background-{new_id()}", 20)
    windows = {size: Window(store, size) for size in SIZES}
    for window in windows.values():
        window.write_turns(block)  # warm up
    results: dict[str, dict[int, list[float]]] = {"write": {}, "read": {}, "update": {}}
    # Short blocks, alternating between sizes: a burst of load from elsewhere on the machine
    # spoils a few blocks of every size alike, and the median drops them.
    for n in range(blocks):
        for size, window in windows.items():
            results["write"].setdefault(size, []).append(window.write_turns(block))
            reads = max(1, block * 10 // size)
            results["read"].setdefault(size, []).append(window.reads(reads))
            if n % 10 == 0:
                turns = max(1, block * 10 // size)
                results["update"].setdefault(size, []).append(window.update_turns(turns))
    median = {k: {size: statistics.median(v) for size, v in r.items()} for k, r in results.items()}
    for size in SIZES:
        print(
            f"  window {size:5}: write {us(median['write'][size])}"
            f"   read {us(median['read'][size])}"
            f"   update_messages turn {us(median['update'][size])}"
        )
    for size in SIZES[1:]:
        ratio = median["write"][size] / median["write"][SIZES[0]]
        print(f"  write ratio {size}/{SIZES[0]}: {ratio:.2f}")
    throughput = statistics.median(concurrent_turns(store, 8, block * 5) for _ in range(5))
    print(f"  8 threads, distinct ids: {throughput:,.0f} turns/s (a read and a write each)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--against", action="append", default=[], metavar="REF", help="a git ref to compare"
    )
    parser.add_argument("--quick", action="store_true", help="a short run: 2 rounds, 32 reads")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5)")
    parser.add_argument("-n", type=int, help="reads per round and scenario (default 96)")
    parser.add_argument(
        "--stores",
        help=f"comma-separated: of {', '.join(READ_STORES)} (or, with --sizes, "
        f"of {', '.join(STORES)})",
    )
    parser.add_argument("--sizes", action="store_true", help="the per-window-size table")
    parser.add_argument("--blocks", type=int, default=60, help="with --sizes: blocks per size")
    args = parser.parse_args()
    if args.worker is not None:
        serve_reads(args.worker)
        return
    if args.sizes:
        for name in (args.stores or ",".join(STORES)).split(","):
            print(f"== {name}")
            with STORES[name]() as store:
                measure_sizes(store, 200 if name == "in_memory" else 10, args.blocks)
        return
    stores = (args.stores or ",".join(READ_STORES)).split(",")
    unknown = set(stores) - set(READ_STORES)
    if unknown:
        parser.error(f"unknown stores: {', '.join(sorted(unknown))}")
    rounds = args.rounds or (2 if args.quick else 5)
    n = args.n or (CONVERSATIONS if args.quick else 3 * CONVERSATIONS)
    plan = [
        (f"{store}-{kind}-{active}", n)
        for store in stores
        for active in (CONVERSATIONS, 1)
        for kind in KINDS
    ]
    results, names = interleaved(__file__, args.against, ",".join(stores), rounds, plan)
    report_reads(results, names, rounds, n)


if __name__ == "__main__":
    main()
