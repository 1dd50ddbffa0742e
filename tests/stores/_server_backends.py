"""Redis and PostgreSQL for the store tests: where they are, and what to do when they are not.

The servers are the ones ``bash .ci/services`` starts: Redis on 127.0.0.1:6379 and
PostgreSQL on 127.0.0.1:5432 (user ``postgres``, trust auth, database ``test``);
``AISERVICES_TEST_REDIS_URL`` and ``AISERVICES_TEST_POSTGRES_DSN`` point the tests elsewhere.
A test that needs a server it cannot reach is skipped, saying how to start it; with
``CI=true`` it fails instead, so that CI never passes by skipping.

Each test gets its own data: Redis keys under a prefix of its own, PostgreSQL tables of its
own, removed when the test ends.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

from aiservices.stores.postgres import PostgresChatMemoryStore
from aiservices.stores.redis import RedisChatMemoryStore

REDIS_URL = os.environ.get("AISERVICES_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get(
    "AISERVICES_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(what: str, why: object) -> NoReturn:
    """Skip the test (fail it under CI) because ``what`` is not there."""
    reason = f"{what} ({why}); start it with `bash .ci/services`"
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@functools.cache
def _redis_problem() -> str | None:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, retry=None)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc)
    finally:
        client.close()
    return None


@functools.cache
def _postgres_problem() -> str | None:
    import psycopg

    try:
        psycopg.connect(POSTGRES_DSN, connect_timeout=2).close()
    except psycopg.Error as exc:
        return " ".join(str(exc).split())
    return None


def require_redis() -> str:
    """The Redis URL, once the server answered; skip (or fail under CI) if it does not."""
    problem = _redis_problem()
    if problem is not None:
        unavailable(f"Redis is not reachable at {REDIS_URL}", problem)
    return REDIS_URL


def require_postgres() -> str:
    """The PostgreSQL DSN, once the server answered; skip (or fail under CI) if it does not."""
    problem = _postgres_problem()
    if problem is not None:
        unavailable(f"PostgreSQL is not reachable at {POSTGRES_DSN!r}", problem)
    return POSTGRES_DSN


def drop_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def drop_postgres_tables(dsn: str, table: str) -> None:
    import psycopg
    from psycopg import sql

    names = [table, f"{table}_history", f"{table}_conversations", f"{table}_schema"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}").format(
                sql.SQL(", ").join(sql.Identifier(n) for n in names)
            )
        )


@contextmanager
def redis_backend(tmp_path: Path, namespace: str) -> Iterator[Any]:
    url = require_redis()
    prefix = f"test:{namespace}:"
    try:
        yield functools.partial(RedisChatMemoryStore, url, key_prefix=prefix)
    finally:
        drop_redis_keys(url, prefix)


@contextmanager
def postgres_backend(tmp_path: Path, namespace: str) -> Iterator[Any]:
    dsn = require_postgres()
    table = f"t_{namespace}"
    try:
        yield functools.partial(PostgresChatMemoryStore, dsn, table=table)
    finally:
        drop_postgres_tables(dsn, table)
