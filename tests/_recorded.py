"""Stores to check byte for byte: what a refused or abandoned turn must leave unchanged."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aiservices import InMemoryChatMemoryStore, SqliteChatMemoryStore
from aiservices.messages import messages_to_json
from aiservices.stores import ChatMemoryStore

Snapshot = Callable[[], bytes]


class StoreUnderTest:
    """A store and a way to read every byte it keeps of its conversations."""

    def __init__(self, store: ChatMemoryStore, snapshot: Snapshot) -> None:
        self.store = store
        self.snapshot = snapshot


def _sqlite(path: Path) -> StoreUnderTest:
    store = SqliteChatMemoryStore(path)

    def snapshot() -> bytes:
        # Every row of the table, every column: ids, times, JSON text, sequence numbers.
        with sqlite3.connect(path) as raw:
            rows = raw.execute("SELECT * FROM chat_messages ORDER BY memory_key, seq").fetchall()
        return repr(rows).encode()

    return StoreUnderTest(store, snapshot)


def _in_memory() -> StoreUnderTest:
    store = InMemoryChatMemoryStore()

    def snapshot() -> bytes:
        # The JSON form keeps ids, turn ids and times exactly.
        return messages_to_json(store.get_messages("u")).encode()

    return StoreUnderTest(store, snapshot)


@pytest.fixture(params=["in_memory", "sqlite"])
def store_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreUnderTest]:
    if request.param == "sqlite":
        found = _sqlite(tmp_path / "chat.db")
        yield found
        found.store.close()  # type: ignore[attr-defined]
    else:
        yield _in_memory()
