"""Store latency and throughput, run by hand: ``python benchmarks/bench_stores.py``.

Prints, for each store in ``STORES``:
- the per-turn write (``apply_changes`` with 2 appended and 2 removed, as a window at
  capacity does) and the read (``get_messages``) with windows of 10, 1000 and 10,000
  messages, and the write ratios to the window of 10 (flat means <= 1.5);
- for comparison, a turn written with ``update_messages`` (the whole window given);
- turns per second (a read and a write each) with 8 threads on distinct memory ids.

To measure another store, add a factory to ``STORES``: a context manager that yields a
fresh, empty store and removes its data afterwards.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from aiservices.messages import AiMessage, ChatMessage, UserMessage, new_message_id
from aiservices.stores import InMemoryChatMemoryStore, SqliteChatMemoryStore


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


REDIS_URL = os.environ.get("AISERVICES_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get(
    "AISERVICES_BENCH_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)


@contextmanager
def redis_store(**options: Any) -> Iterator[Any]:
    import redis

    from aiservices.stores.redis import RedisChatMemoryStore

    prefix = f"bench:{new_message_id()}:"
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

    from aiservices.stores.postgres import PostgresChatMemoryStore

    table = f"bench_{new_message_id()}"
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


def turn_messages(turn: int) -> list[ChatMessage]:
    question = f"Question number {turn}: what is the weather like in Paris today?"
    answer = f"Answer {turn}: it is sunny in Paris, 21 degrees, with a light breeze."
    return [
        UserMessage(question, message_id=new_message_id()),
        AiMessage(answer, message_id=new_message_id()),
    ]


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
        self.memory_id = f"window-{size}-{new_message_id()}"
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


def measure(store: Any, block: int, blocks: int) -> None:
    # Other conversations in the file, as in real use: a 10-message window alone would fit
    # in one page of a fresh SQLite file, which flatters it.
    for _ in range(200):
        fill(store, f"background-{new_message_id()}", 20)
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


SIZES = (10, 1000, 10_000)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated names")
    parser.add_argument("--blocks", type=int, default=60, help="measured blocks per size")
    args = parser.parse_args()
    for name in args.stores.split(","):
        print(f"== {name}")
        with STORES[name]() as store:
            measure(store, 200 if name == "in_memory" else 10, args.blocks)


if __name__ == "__main__":
    main()
