"""Fixtures that run the store contract suite against every store.

Each store is one entry of ``BACKENDS``. To add a store, write a factory and register it;
nothing in the suite changes:

    @contextmanager
    def redis_backend(tmp_path: Path, namespace: str) -> Iterator[Opener]:
        client = connect_or_skip()      # pytest.skip(...) with how to start the server
        yield functools.partial(RedisChatMemoryStore, URL, key_prefix=f"test:{namespace}:")
        for key in client.scan_iter(f"test:{namespace}:*"):
            client.delete(key)

    BACKENDS["redis"] = Backend(redis_backend, persistent=True, history=True)

A factory gets a fresh temporary directory and a unique ``namespace`` string, yields an
*opener*, and removes what the test stored when it resumes. Calling the opener opens a new
store object on the same data, passing on keyword options (``keep_history=True``). For a
``persistent`` backend a second store object sees the first one's messages, and the opener
must pickle, since tests call it in other processes too; a ``history`` backend takes
``keep_history=True`` and has ``get_history`` and ``forget``.

Fixtures: ``store`` (a fresh store of each backend), ``backend`` (an ``OpenedBackend`` that
opens more store objects and closes them all at the end), ``persistent_backend`` and
``history_store`` (only the backends that have the capability).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiservices.stores import InMemoryChatMemoryStore, SqliteChatMemoryStore

from ._server_backends import postgres_backend, redis_backend

Opener = Callable[..., Any]
Factory = Callable[[Path, str], AbstractContextManager[Opener]]


@dataclass(frozen=True)
class Backend:
    """A store the suite runs against, and what it can do."""

    factory: Factory
    persistent: bool
    history: bool


@contextmanager
def in_memory_backend(tmp_path: Path, namespace: str) -> Iterator[Opener]:
    yield InMemoryChatMemoryStore


@contextmanager
def sqlite_backend(tmp_path: Path, namespace: str) -> Iterator[Opener]:
    yield functools.partial(SqliteChatMemoryStore, tmp_path / "chat.db")


BACKENDS: dict[str, Backend] = {
    "in_memory": Backend(in_memory_backend, persistent=False, history=False),
    "sqlite": Backend(sqlite_backend, persistent=True, history=True),
    # Before the fixtures below: their params are read when they are defined.
    "redis": Backend(redis_backend, persistent=True, history=True),
    "postgres": Backend(postgres_backend, persistent=True, history=True),
}


@dataclass
class OpenedBackend:
    """One backend for one test: opens store objects on the test's data."""

    name: str
    spec: Backend
    opener: Opener
    opened: list[Any] = field(default_factory=list)

    def open(self, **options: Any) -> Any:
        store = self.opener(**options)
        self.opened.append(store)
        return store


@contextmanager
def _opened(name: str, tmp_path: Path) -> Iterator[OpenedBackend]:
    spec = BACKENDS[name]
    with spec.factory(tmp_path, uuid.uuid4().hex) as opener:
        backend = OpenedBackend(name, spec, opener)
        try:
            yield backend
        finally:
            for store in backend.opened:
                close = getattr(store, "close", None)
                if close is not None:
                    close()


def _names(*, persistent: bool = False, history: bool = False) -> list[str]:
    return [
        name
        for name, spec in BACKENDS.items()
        if (spec.persistent or not persistent) and (spec.history or not history)
    ]


@pytest.fixture(params=_names())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedBackend]:
    with _opened(request.param, tmp_path) as opened:
        yield opened


@pytest.fixture
def store(backend: OpenedBackend) -> Any:
    return backend.open()


@pytest.fixture(params=_names(persistent=True))
def persistent_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedBackend]:
    with _opened(request.param, tmp_path) as opened:
        yield opened


@pytest.fixture(params=_names(history=True))
def history_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedBackend]:
    with _opened(request.param, tmp_path) as opened:
        yield opened


@pytest.fixture
def history_store(history_backend: OpenedBackend) -> Any:
    return history_backend.open(keep_history=True)
